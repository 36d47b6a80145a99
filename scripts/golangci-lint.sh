#!/usr/bin/env bash
# Runs golangci-lint at the version the Makefile pins, with .golangci.yml (which adds the
# integration build tag, so every file is linted), and once more without the tag so code that
# only builds without it is checked too. Installs that version into GOPATH/bin with `go install`
# when it is missing or another version; later runs reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: scripts/golangci-lint.sh VERSION}
bin="$(go env GOPATH)/bin/golangci-lint"
if ! [[ -x $bin ]] || ! "$bin" version 2>/dev/null | grep -q "version ${version#v} "; then
	echo "lint: go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$version" >&2
	go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$version"
fi
"$bin" run ./...
# The flag cannot clear the config's tags, so the second run gets a copy without them.
untagged=$(mktemp --suffix=.yml)
trap 'rm -f "$untagged"' EXIT
grep -v 'build-tags:' .golangci.yml >"$untagged"
"$bin" run -c "$untagged" ./...
