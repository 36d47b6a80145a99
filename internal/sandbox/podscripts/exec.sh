# shellcheck shell=sh
# Runs one command: sh -c "$(killfunc.sh exec.sh)" boxcar-exec TIMEOUT NONCE DIR NAME=VALUE... ARGV...
t=$1 m=$2 d=$3
shift 3
cd -- "$d" 2>/dev/null || { echo "boxcar-$m: notfound" >&2; exit 125; }
exec 3<&0
env -i "BOXCAR_EXEC=$m" "$@" 0<&3 3<&- &
c=$!
exec 3<&-
w=
if [ "$t" != 0 ]; then
	# The watchdog: at the timeout, k kills the command's tree. Told to stop (TERM), it kills
	# its sleep by pid: left behind, one per command for a whole timeout, the sleeps would fill
	# the pod's process bound, and a sleep forked but not yet executed when the command ended
	# carries no mark for k to find. d and s close the gap between the fork and s=$!; KILL,
	# as a child not yet executed holds this trap, and exec drops the TERM it caught. Once the
	# sleep is waited for, the trap goes: a TERM during k ends the watchdog, whose kill the
	# command's end repeats, rather than kill a pid that is no longer the sleep's.
	(
		d='' s=''
		trap 'd=1; [ -n "$s" ] && kill -9 "$s"' TERM
		env "BOXCAR_EXEC=$m" sleep "$t" &
		s=$!
		[ -n "$d" ] && kill -9 "$s"
		wait "$s"
		s=''
		trap - TERM
		[ -n "$d" ] && exit
		k "$m"
	) </dev/null >/dev/null 2>&1 &
	w=$!
fi
wait "$c"
rc=$?
[ -n "$w" ] && kill "$w" 2>/dev/null
k "$m"
exit "$rc"
