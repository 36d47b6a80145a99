#!/usr/bin/env bash
# build.sh installs the Debian parts the test cluster needs and builds the
# Kubernetes control-plane and node binaries into a cache outside the repo.
# It is idempotent: a second run with everything in place takes well under a second.
#
#   BOXCAR_CLUSTER_CACHE  cache root (default $HOME/.cache/boxcar-cluster)
#
# The Kubernetes binaries come from k8s.io/kubernetes at v1.37.2 built with
# Kubernetes' own go.mod, its ./staging replaces pointed at the published
# v0.37.2 staging modules (the module zip carries no staging tree).
set -euo pipefail

K8S_VERSION=v1.37.2
STAGING_VERSION=v0.37.2
CACHE="${BOXCAR_CLUSTER_CACHE:-$HOME/.cache/boxcar-cluster}"
BIN="$CACHE/$K8S_VERSION/bin"
BINARIES=(kube-apiserver kubelet kube-scheduler kube-controller-manager)

log() { printf 'build.sh: %s\n' "$*" >&2; }

# Debian parts: containerd + ctr, runc, etcd, CNI loopback, busybox for the sandbox image.
install_debs() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  command -v etcd >/dev/null || missing+=(etcd-server)
  [ -x /usr/lib/cni/loopback ] || missing+=(containernetworking-plugins)
  [ -x /bin/busybox ] || missing+=(busybox-static)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    log "missing Debian packages; run: sudo apt-get update && sudo apt-get install -y ${missing[*]}"
    exit 1
  fi
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

build_kubernetes() {
  local have=1 b
  for b in "${BINARIES[@]}"; do [ -x "$BIN/$b" ] || have=0; done
  if [ "$have" = 1 ]; then log "kubernetes $K8S_VERSION binaries cached in $BIN"; return 0; fi

  local start=$SECONDS
  log "downloading k8s.io/kubernetes@$K8S_VERSION"
  local dir
  dir="$(cd "$CACHE" && GOWORK=off GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [ -d "$dir" ] || { log "go mod download k8s.io/kubernetes@$K8S_VERSION gave no source dir"; exit 1; }

  # A writable copy: the module cache is read-only and go.mod must change.
  local src="$CACHE/$K8S_VERSION/src"
  rm -rf "$src" && mkdir -p "$src"
  cp -a "$dir/." "$src/" && chmod -R u+w "$src"
  rm -f "$src/go.work" "$src/go.work.sum"
  sed -i -E \
    -e '/k8s\.io\/sample-(cli-plugin|controller)/d' \
    -e "s#^([[:space:]]*)k8s\.io/([A-Za-z0-9._-]+) => \./staging/src/k8s\.io/[A-Za-z0-9._-]+#\1k8s.io/\2 => k8s.io/\2 $STAGING_VERSION#" \
    "$src/go.mod"

  log "compiling ${BINARIES[*]} (cold: about 12 minutes on 2 cores)"
  local pkg=() tmp="$CACHE/$K8S_VERSION/bin.tmp"
  for b in "${BINARIES[@]}"; do pkg+=("./cmd/$b"); done
  rm -rf "$tmp" && mkdir -p "$tmp"
  (cd "$src" && GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37 -X k8s.io/component-base/version.gitTreeState=clean" \
    -o "$tmp/" "${pkg[@]}")
  rm -rf "$BIN" && mv "$tmp" "$BIN"
  log "built kubernetes $K8S_VERSION in $((SECONDS - start))s into $BIN"
}

mkdir -p "$CACHE"
install_debs
build_kubernetes
