#!/usr/bin/env bash
# Prints the data races the race detector wrote into $1 (GORACE log_path), the first one last:
# a failing `make test` ends with the report that says which two goroutines raced and where.
set -euo pipefail
dir=$1
mapfile -t reports < <(ls -tr "$dir"/report.* 2>/dev/null || true)
if ((${#reports[@]} == 0)); then
	echo "no data race reported (the failure is above)"
	exit 0
fi
echo "data race reports: ${#reports[@]} file(s) in $dir"
for ((i = ${#reports[@]} - 1; i >= 0; i--)); do
	echo "== ${reports[i]}"
	cat "${reports[i]}"
done
