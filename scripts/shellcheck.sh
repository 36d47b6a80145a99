#!/usr/bin/env bash
# Checks every shell script in the repository with shellcheck: the scripts here and the POSIX sh
# the kubernetes backend runs inside pods (internal/sandbox/podscripts). Installs shellcheck
# with apt when root and it is missing; otherwise stops with the command to run.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v shellcheck >/dev/null 2>&1; then
	if [[ $(id -u) -ne 0 ]]; then
		echo "missing shellcheck: run  sudo apt-get install -y shellcheck" >&2
		exit 1
	fi
	echo "lint: apt-get install -y shellcheck" >&2
	scripts/apt-get.sh update -qq >/dev/null
	scripts/apt-get.sh install -y -qq shellcheck >/dev/null
fi
mapfile -t files < <(git ls-files '*.sh')
shellcheck "${files[@]}"
