#!/usr/bin/env bash
# docker.sh makes a Docker engine available for `make image` and the container tests, or stops
# with the exact command to run. It prints what it did, and running it again changes nothing.
#
#   - `docker info` answers: nothing to do (any engine will do, ours or the machine's).
#   - else, as root: installs Debian's docker.io when dockerd is missing, then starts containerd
#     and dockerd in the background, both on dockerd's default paths (/var/lib/docker,
#     /var/run/docker, /var/run/docker.sock), kept off the network: no bridge, no iptables or
#     ip6tables rules, no masquerading. Containers use host networking or none.
#   - not root: stops and names the command.
#
# Logs: /var/log/boxcar-docker/{containerd,dockerd}.log.
set -euo pipefail

docker_cli=${DOCKER:-docker}
log_dir=/var/log/boxcar-docker
# dockerd's defaults: what its own supervisor would use for the containerd it starts. We start
# that containerd ourselves because dockerd 20.10 would otherwise attach to any containerd
# listening on /run/containerd/containerd.sock, which may belong to someone else (a test
# Kubernetes cluster); with --containerd it uses exactly this one.
ctr_root=/var/lib/docker/containerd/daemon
ctr_state=/var/run/docker/containerd/daemon
ctr_sock=/var/run/docker/containerd/containerd.sock
ctr_config=/var/run/docker/containerd/containerd.toml
docker_sock=/var/run/docker.sock
wait_seconds=${DOCKER_WAIT_SECONDS:-60}

say() { echo "docker: $*" >&2; }

engine_answers() { "$docker_cli" info >/dev/null 2>&1; }

if engine_answers; then
	say "engine answers on ${DOCKER_HOST:-unix://$docker_sock}; nothing to do"
	exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
	say "no Docker engine answers, and starting one needs root. Run:"
	echo "  sudo $(cd "$(dirname "$0")" && pwd)/docker.sh" >&2
	exit 1
fi

if ! command -v "$docker_cli" >/dev/null 2>&1 || ! command -v dockerd >/dev/null 2>&1 || ! command -v containerd >/dev/null 2>&1; then
	say "apt-get install -y docker.io (dockerd 20.10, containerd, runc)"
	# Keep the packages' maintainer scripts from starting their services: the default dockerd
	# would create the docker0 bridge and iptables rules, and the packaged containerd would
	# take /run/containerd. A policy-rc.d that is already there (it usually says the same) is
	# left alone.
	policy=/usr/sbin/policy-rc.d
	own_policy=
	if [[ ! -e $policy ]]; then
		printf '#!/bin/sh\n# boxcar scripts/docker.sh: no service starts during apt-get install\nexit 101\n' >"$policy"
		chmod 0755 "$policy"
		own_policy=1
	fi
	export DEBIAN_FRONTEND=noninteractive
	status=0
	apt="$(dirname "$0")/apt-get.sh"
	{ "$apt" update -qq >/dev/null && "$apt" install -y -qq --no-install-recommends docker.io >/dev/null; } || status=$?
	[[ -n $own_policy ]] && rm -f "$policy"
	if [[ $status -ne 0 ]]; then
		say "apt-get install docker.io failed (exit $status); run it by hand to see why:"
		echo "  apt-get update && apt-get install -y docker.io" >&2
		exit 1
	fi
fi

mkdir -p "$log_dir" "$ctr_root" "$ctr_state" "$(dirname "$ctr_sock")"

# running PIDFILE: the process the pid file names is alive.
running() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# wait_for DESCRIPTION COMMAND...: polls COMMAND until it succeeds, for up to wait_seconds.
wait_for() {
	local what=$1
	shift
	for ((i = 0; i < wait_seconds * 10; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	say "$what did not come up within ${wait_seconds}s; its log ends with:"
	tail -n 30 "$log_dir/$what.log" >&2 || true
	exit 1
}

ctr_pid=/var/run/docker/containerd/containerd.pid
if running "$ctr_pid"; then
	say "containerd already running (pid $(cat "$ctr_pid")) on $ctr_sock"
else
	# The CRI plugin is Kubernetes' and would open a streaming port; dockerd needs none of it.
	# No debug or metrics listener.
	cat >"$ctr_config" <<EOF
version = 2
root = "$ctr_root"
state = "$ctr_state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$ctr_sock"
[debug]
  address = ""
[metrics]
  address = ""
EOF
	rm -f "$ctr_sock"
	setsid containerd --config "$ctr_config" </dev/null >>"$log_dir/containerd.log" 2>&1 &
	echo $! >"$ctr_pid"
	say "started containerd (pid $!) on $ctr_sock, state under $ctr_root and $ctr_state"
	wait_for containerd test -S "$ctr_sock"
fi

docker_pid=/var/run/docker.pid
if running "$docker_pid"; then
	say "dockerd already running (pid $(cat "$docker_pid")); waiting for it to answer"
else
	# --bridge=none: no docker0 and no default bridge network; --iptables/--ip6tables/
	# --ip-masq=false: no firewall or NAT rules on the host. The rest are dockerd's default
	# paths, spelled out so nothing else's state is used.
	setsid dockerd \
		--host "unix://$docker_sock" \
		--containerd "$ctr_sock" \
		--data-root /var/lib/docker \
		--exec-root /var/run/docker \
		--pidfile "$docker_pid" \
		--bridge=none --iptables=false --ip6tables=false --ip-masq=false \
		</dev/null >>"$log_dir/dockerd.log" 2>&1 &
	say "started dockerd (pid $!) on unix://$docker_sock: --bridge=none --iptables=false --ip6tables=false --ip-masq=false, containerd $ctr_sock"
fi
wait_for dockerd engine_answers
say "engine ready: $("$docker_cli" version --format 'server {{.Server.Version}}, API {{.Server.APIVersion}}' 2>/dev/null || echo answering)"
