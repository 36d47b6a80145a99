# shellcheck shell=sh
# k NONCE kills every process whose environment holds BOXCAR_EXEC=NONCE, until none is left,
# and returns 0 only once it has seen none left. A shell that cannot fork the grep (a fork bomb
# fills the pod's process bound) exits non-zero. exec.sh and kill.sh are sent with this prepended.
k() {
	i=0
	while [ "$i" -lt 20 ]; do
		p=
		# shellcheck disable=SC2013 # grep -l prints /proc/PID/environ names: no blanks in them
		for f in $(grep -l -s -z -x -F "BOXCAR_EXEC=$1" /proc/[0-9]*/environ); do
			f=${f#/proc/}
			p="$p ${f%/environ}"
		done
		[ -z "$p" ] && return
		# shellcheck disable=SC2086 # $p is a list of pids, split on purpose
		kill -STOP $p
		# shellcheck disable=SC2086
		kill -9 $p
		i=$((i+1))
	done
	return 1
} 2>/dev/null
