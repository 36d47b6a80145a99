#!/usr/bin/env bash
# install-versitygw.sh installs the S3 server the store tests run against (versitygw, Apache-2.0)
# with `go install`, unless the wanted version is already there. It builds it static
# (CGO_ENABLED=0): the container tests copy this binary into a FROM scratch image, and no test
# compiles it. It prints what it did.
# Usage: scripts/install-versitygw.sh    (VERSITYGW_VERSION overrides the version)
set -euo pipefail

version="${VERSITYGW_VERSION:-v1.8.0}"
module="github.com/versity/versitygw"

gobin="$(go env GOBIN)"
if [[ -z "$gobin" ]]; then
	gobin="$(go env GOPATH | cut -d: -f1)/bin"
fi

# installed_version prints the module version a versitygw binary was built from, or nothing.
installed_version() {
	go version -m "$1" 2>/dev/null | awk -v m="$module" '$1 == "mod" && $2 == m { print $3 }'
}

# static says whether a binary was built with CGO_ENABLED=0.
static() {
	go version -m "$1" 2>/dev/null | grep -q $'^\tbuild\tCGO_ENABLED=0$'
}

for candidate in "$(command -v versitygw || true)" "$gobin/versitygw"; do
	if [[ -n "$candidate" && -x "$candidate" ]]; then
		have="$(installed_version "$candidate")"
		if [[ "$have" == "$version" ]] && static "$candidate"; then
			echo "versitygw $version already installed at $candidate; nothing to do"
			exit 0
		fi
		echo "found versitygw at $candidate built from '${have:-unknown}', want $version built with CGO_ENABLED=0"
	fi
done

echo "installing versitygw $version into $gobin (about 2 minutes on a cold module cache)"
start=$SECONDS
CGO_ENABLED=0 GOFLAGS=-mod=mod go install "$module/cmd/versitygw@$version"
echo "installed $gobin/versitygw ($(installed_version "$gobin/versitygw")) in $((SECONDS - start))s"
case ":$PATH:" in
*":$gobin:"*) ;;
*) echo "note: $gobin is not on PATH; the tests look there anyway" ;;
esac
