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
	# The watchdog's sleep carries the command's mark, so the k below ends it with the command:
	# left behind, one per command for a whole timeout, they would fill the pod's process bound.
	(env "BOXCAR_EXEC=$m" sleep "$t"; k "$m") </dev/null >/dev/null 2>&1 &
	w=$!
fi
wait "$c"
rc=$?
[ -n "$w" ] && kill "$w" 2>/dev/null
k "$m"
exit "$rc"
