#!/usr/bin/env bash
# install-seaweedfs.sh builds SeaweedFS's weed (Apache-2.0), the second S3 server the store's
# conformance tests run against, from its Go module at a pinned version, unless that version is
# already installed. Its go.mod has replace directives, so `go install module@version` refuses
# it; the module is downloaded through the module proxy and built in its own folder instead.
# Usage: scripts/install-seaweedfs.sh    (SEAWEEDFS_VERSION overrides the version)
set -euo pipefail

version="${SEAWEEDFS_VERSION:-v0.0.0-20261109003541-7506e5f91cd6}"
module="github.com/seaweedfs/seaweedfs"

gobin="$(go env GOBIN)"
if [[ -z "$gobin" ]]; then
	gobin="$(go env GOPATH | cut -d: -f1)/bin"
fi
# A build inside the module's folder stamps no module version into the binary, so the version
# is kept beside it.
stamp="$gobin/.weed.version"

mkdir -p "$gobin"
# One install at a time: two checkouts on one machine share GOBIN, and the second must neither
# write weed.tmp beside the first nor take a half-installed weed for a finished one. It checks
# the stamp once it holds the lock, so it finds what the first installed.
exec 9>"$gobin/.weed.lock"
flock 9

if [[ -x "$gobin/weed" && -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
	echo "weed $version already installed at $gobin/weed; nothing to do"
	exit 0
fi

echo "installing weed $version into $gobin (several minutes on a cold module and build cache)"
start=$SECONDS
dir="$(GOFLAGS=-mod=mod go mod download -json "$module@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
if [[ -z "$dir" || ! -d "$dir/weed" ]]; then
	echo "install-seaweedfs: go mod download $module@$version gave no source folder" >&2
	exit 1
fi
(cd "$dir" && GOFLAGS=-mod=mod go build -trimpath -o "$gobin/weed.tmp" ./weed)
mv "$gobin/weed.tmp" "$gobin/weed"
echo "$version" >"$stamp"
echo "installed $gobin/weed in $((SECONDS - start))s"
