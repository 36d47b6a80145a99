# shellcheck shell=sh
# Kills a command's tree from outside: sh -c "$(killfunc.sh kill.sh)" boxcar-kill NONCE
k "$1"
