#!/usr/bin/env bash
# Installs what Boxcar needs on a Debian machine, or stops with the exact command to run.
#   deps.sh runtime   bubblewrap and python3 (the example profile's tool runs python3)
#   deps.sh test      runtime deps plus versitygw and SeaweedFS (S3 servers), prometheus (promtool, server) and a
#                     Docker engine for the container tests (scripts/docker.sh)
set -euo pipefail
mode=${1:-runtime}

apt_updated=
need_apt() { # need_apt COMMAND PACKAGE
	command -v "$1" >/dev/null 2>&1 && return 0
	if [[ $(id -u) -ne 0 ]]; then
		echo "missing $1: run  sudo apt-get install -y $2" >&2
		exit 1
	fi
	if [[ -z $apt_updated ]]; then
		echo "deps: apt-get update" >&2
		"$(dirname "$0")/apt-get.sh" update -qq >/dev/null
		apt_updated=1
	fi
	echo "deps: apt-get install -y $2" >&2
	"$(dirname "$0")/apt-get.sh" install -y -qq "$2" >/dev/null
}

need_apt bwrap bubblewrap
# The sandbox sees the host's /usr read-only: python3 must be the system one.
if [[ ! -x /usr/bin/python3 ]]; then
	need_apt /usr/bin/python3 python3
fi

if [[ $mode == test ]]; then
	need_apt busybox busybox-static # the kubernetes backend's shell wrappers run in a busybox image in tests
	need_apt ip iproute2 # the containment tests read interfaces and routes from inside with ip
	# promtool checks the worker's metrics and the chart's alerts; the e2e tests start prometheus
	need_apt promtool prometheus
	"$(dirname "$0")/install-versitygw.sh" >&2
	# The second S3 implementation the store's conformance tests run against (about 11 min to
	# build on a cold cache, nothing once built: the version is checked)
	"$(dirname "$0")/install-seaweedfs.sh" >&2
	# The container tests (test/e2e/container_test.go) need an engine: docker.sh installs
	# docker.io and starts dockerd off the network (--bridge=none, no iptables) when none answers.
	"$(dirname "$0")/docker.sh"
fi
