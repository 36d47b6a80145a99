# shellcheck shell=sh
# The container's own process: it only has to stay alive; commands arrive through pods/exec.
# boxcar-pause: the exec script's kill (killfunc.sh) finds it so in /proc/1/cmdline.
trap 'exit 0' TERM INT
while :; do sleep 3600 & wait $!; done
