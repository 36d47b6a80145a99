#!/usr/bin/env bash
# build.sh installs the Debian parts the test cluster needs and builds the
# Kubernetes control-plane and node binaries into a cache outside the repo.
# It is idempotent: a second run with everything in place takes well under a second, and a
# binary added to the list later is built alone from the cached source. It also builds
# keda-standin (test/cluster/keda, KEDA's scaler code) and keeps KEDA's CRDs beside it.
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
BINARIES=(kube-apiserver kubelet kube-scheduler kube-controller-manager kube-proxy)
# CoreDNS: test/cluster/coredns is a module of its own that builds CoreDNS's packages with the
# few plugins the cluster's Corefile uses.
COREDNS_VERSION=v1.15.0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log() { printf 'build.sh: %s\n' "$*" >&2; }

# Debian parts: containerd + ctr, runc, etcd, the CNI loopback, bridge and host-local plugins,
# busybox for the images, iptables for kube-proxy.
install_debs() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  command -v etcd >/dev/null || missing+=(etcd-server)
  [ -x /usr/lib/cni/loopback ] || missing+=(containernetworking-plugins)
  [ -x /bin/busybox ] || missing+=(busybox-static)
  command -v iptables-restore >/dev/null || missing+=(iptables) # kube-proxy's iptables mode
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    log "missing Debian packages; run: sudo apt-get update && sudo apt-get install -y ${missing[*]}"
    exit 1
  fi
  log "installing ${missing[*]}"
  "$HERE/../../scripts/apt-get.sh" update -qq
  "$HERE/../../scripts/apt-get.sh" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

build_kubernetes() {
  local missing=() b
  for b in "${BINARIES[@]}"; do [ -x "$BIN/$b" ] || missing+=("$b"); done
  if [ ${#missing[@]} -eq 0 ]; then log "kubernetes $K8S_VERSION binaries cached in $BIN"; return 0; fi

  local start=$SECONDS src="$CACHE/$K8S_VERSION/src"
  # The sed below is the copy's last step: a go.mod it rewrote means a whole copy.
  if ! grep -q "k8s.io/api => k8s.io/api $STAGING_VERSION" "$src/go.mod" 2>/dev/null; then
    log "downloading k8s.io/kubernetes@$K8S_VERSION"
    local dir
    dir="$(cd "$CACHE" && GOWORK=off GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [ -d "$dir" ] || { log "go mod download k8s.io/kubernetes@$K8S_VERSION gave no source dir"; exit 1; }

    # A writable copy: the module cache is read-only and go.mod must change.
    rm -rf "$src" && mkdir -p "$src"
    cp -a "$dir/." "$src/" && chmod -R u+w "$src"
    rm -f "$src/go.work" "$src/go.work.sum"
    sed -i -E \
      -e '/k8s\.io\/sample-(cli-plugin|controller)/d' \
      -e "s#^([[:space:]]*)k8s\.io/([A-Za-z0-9._-]+) => \./staging/src/k8s\.io/[A-Za-z0-9._-]+#\1k8s.io/\2 => k8s.io/\2 $STAGING_VERSION#" \
      "$src/go.mod"
  fi

  log "compiling ${missing[*]} (cold, all five: about 13 minutes on 2 idle cores)"
  local pkg=() tmp="$CACHE/$K8S_VERSION/bin.tmp"
  for b in "${missing[@]}"; do pkg+=("./cmd/$b"); done
  rm -rf "$tmp" && mkdir -p "$tmp" "$BIN"
  (cd "$src" && GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37 -X k8s.io/component-base/version.gitTreeState=clean" \
    -o "$tmp/" "${pkg[@]}")
  mv "$tmp"/* "$BIN"/ && rmdir "$tmp"
  log "built ${missing[*]} in $((SECONDS - start))s into $BIN"
}

build_coredns() {
  local out="$CACHE/coredns-$COREDNS_VERSION/bin/coredns"
  if [ -x "$out" ]; then log "coredns $COREDNS_VERSION cached in $out"; return 0; fi
  local start=$SECONDS
  mkdir -p "$(dirname "$out")"
  log "compiling coredns $COREDNS_VERSION (cold: a minute or two on 2 cores)"
  (cd "$HERE/coredns" && GOWORK=off CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out.tmp" .)
  mv "$out.tmp" "$out"
  log "built coredns $COREDNS_VERSION in $((SECONDS - start))s into $out"
}

# nats-server, static, for the NATS image the tests run as a StatefulSet: the version Boxcar's
# own go.mod names, built from that module.
build_nats_server() {
  local out="$CACHE/images/nats-server" want
  want="$(cd "$HERE/../.." && go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)"
  if [ -x "$out" ] && "$out" --version 2>/dev/null | grep -qF "$want"; then log "nats-server $want cached in $out"; return 0; fi
  local start=$SECONDS
  mkdir -p "$(dirname "$out")"
  (cd "$HERE/../.." && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out.tmp" github.com/nats-io/nats-server/v2)
  mv "$out.tmp" "$out"
  log "built nats-server $want in $((SECONDS - start))s into $out"
}

# keda-standin: test/cluster/keda, a module of its own (KEDA's dependency graph stays out of this
# one), built from KEDA's Go module with KEDA's scaler, fallback and scale executor, and KEDA's
# CRDs from the same module zip (config/crd/bases), into $CACHE/keda-<version>. The binary is
# kept while the module's files are unchanged (their digest is beside it), so a warm run costs
# a digest; a change to the stand-in's own code recompiles one package (Go's build cache keeps
# KEDA's) and links. Cold, KEDA's 3,300 packages take about 15 minutes of CPU.
build_keda() {
  local mod="$HERE/keda" version dir sum
  version="$(sed -n -E 's#^(require)?[[:space:]]*github\.com/kedacore/keda/v2 (v[^ ]+)$#\2#p' "$mod/go.mod")"
  [ -n "$version" ] || { log "test/cluster/keda/go.mod names no github.com/kedacore/keda/v2 version"; exit 1; }
  dir="$CACHE/keda-$version"
  sum="$(cd "$mod" && cat go.mod go.sum ./*.go | sha256sum | cut -d' ' -f1)"
  if [ -x "$dir/bin/keda-standin" ] && [ "$(cat "$dir/bin/keda-standin.sum" 2>/dev/null)" = "$sum" ] &&
    [ -f "$dir/crd/keda.sh_scaledobjects.yaml" ]; then
    log "keda-standin (KEDA $version) cached in $dir/bin"
    return 0
  fi
  mkdir -p "$dir/bin"
  log "compiling keda-standin with KEDA $version's scaler code (cold: about 15 minutes of CPU)"
  local TIMEFORMAT="build.sh: built keda-standin (KEDA $version) in %0R s wall, %0U s user + %0S s sys CPU, into $dir/bin"
  time (cd "$mod" && GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 \
    go build -trimpath -ldflags "-s -w" -o "$dir/bin/keda-standin.tmp" .)
  local src
  src="$(cd "$mod" && GOWORK=off GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' github.com/kedacore/keda/v2)"
  rm -rf "$dir/crd.tmp" && mkdir -p "$dir/crd.tmp"
  cp "$src"/config/crd/bases/*.yaml "$dir/crd.tmp/" && chmod u+w "$dir"/crd.tmp/*
  rm -rf "$dir/crd" && mv "$dir/crd.tmp" "$dir/crd"
  mv "$dir/bin/keda-standin.tmp" "$dir/bin/keda-standin"
  printf '%s\n' "$sum" >"$dir/bin/keda-standin.sum"
}

# The scripted model (cmd/demo-model), static, for the model image: rebuilt every run (a few
# seconds with Boxcar's build cache), so it is always this checkout's.
build_demo_model() {
  mkdir -p "$CACHE/images"
  (cd "$HERE/../.." && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$CACHE/images/demo-model.tmp" ./cmd/demo-model)
  mv "$CACHE/images/demo-model.tmp" "$CACHE/images/demo-model"
}

# The cluster's own programs (cmd/boxcar-cni, cmd/pause, cmd/clusterd), static, into this
# checkout's bin/cluster-helpers, where cluster.Launch runs them: rebuilt every run, which Go's
# build cache makes a link step, so they are always this checkout's.
build_helpers() {
  local out="$HERE/../../bin/cluster-helpers"
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  (cd "$HERE" && CGO_ENABLED=0 go build -trimpath -o "$out.tmp/" ./cmd/boxcar-cni ./cmd/pause ./cmd/clusterd)
  rm -rf "$out" && mv "$out.tmp" "$out"
}

mkdir -p "$CACHE"
# One build at a time: two checkouts on one machine share the cache, and a half-written
# binary must never be taken for a cached one.
exec 9>"$CACHE/.build.lock"
flock 9
install_debs
build_kubernetes
build_coredns
build_nats_server
build_keda
build_demo_model
build_helpers
