# shellcheck shell=sh
# The container's own process: it only has to stay alive; commands arrive through pods/exec.
trap 'exit 0' TERM INT
while :; do sleep 3600 & wait $!; done
