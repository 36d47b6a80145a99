#!/usr/bin/env bash
# install-nats-server.sh installs the nats-server binary `make test-faults` runs as an external
# process, with `go install` at the version go.mod embeds, unless that version is there already.
set -euo pipefail
cd "$(dirname "$0")/.."
version="$(go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)"
gobin="$(go env GOBIN)"
[[ -n "$gobin" ]] || gobin="$(go env GOPATH | cut -d: -f1)/bin"
if [[ -x "$gobin/nats-server" ]] && go version -m "$gobin/nats-server" | grep -q "mod.*nats-server/v2.*$version"; then
	exit 0
fi
echo "installing nats-server $version into $gobin"
GOFLAGS=-mod=mod go install "github.com/nats-io/nats-server/v2@$version"
