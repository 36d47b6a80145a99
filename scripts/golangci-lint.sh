#!/usr/bin/env bash
# Runs golangci-lint at the version the Makefile pins, with .golangci.yml (which adds the
# integration build tag, so every file is linted), and once more without the tag so code that
# only builds without it is checked too; then the test cluster's own modules (test/cluster, and
# test/cluster/keda where it exists), which ./... of the root module does not reach. Installs
# that version into GOPATH/bin with `go install` when it is missing or another version; later
# runs reuse it.
#
# --allow-serial-runners: golangci-lint takes a lock in the temporary folder and, without it,
# gives up after 5 s when another run (another checkout, another user's) holds it; with it, the
# run waits its turn.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: scripts/golangci-lint.sh VERSION}
bin="$(go env GOPATH)/bin/golangci-lint"
if ! [[ -x $bin ]] || ! "$bin" version 2>/dev/null | grep -q "version ${version#v} "; then
	echo "lint: go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$version" >&2
	go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$version"
fi
# The tagged run sees all of the root module, so an exclusion that matched nothing is stale: a
# function that got under the size limits, whose rule must go so the list only shrinks.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
"$bin" run --allow-serial-runners ./... 2>"$log" || status=$?
cat "$log" >&2
if grep -q 'Skipped 0 issues by rules' "$log"; then
	echo "lint: the exclusion rules above match nothing; remove them from .golangci.yml" >&2
	status=1
fi
((status == 0)) || exit "$status"
# The flag cannot clear the config's tags, so the second run gets a copy without them. The copy
# also drops warn-unused: the size exceptions are about internal/, and a run that sees only part
# of the code (no integration files, or another module) would call most of them unused.
untagged=$(mktemp --suffix=.yml)
trap 'rm -f "$log" "$untagged"' EXIT
grep -v -e 'build-tags:' -e 'warn-unused:' .golangci.yml >"$untagged"
"$bin" run --allow-serial-runners -c "$untagged" ./...
# No file of test/cluster has a build tag: one run. test/cluster/coredns and test/cluster/keda
# are left out: each is another project's packages behind a short main, and linting one loads
# all of them (KEDA's took 15-30 minutes in `go list` on a cold cache, holding the lint lock).
(cd test/cluster && "$bin" run --allow-serial-runners -c "$untagged" ./...)
