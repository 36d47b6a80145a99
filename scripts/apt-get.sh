#!/usr/bin/env bash
# apt-get.sh runs apt-get with its arguments, one at a time among the project's scripts: two
# installs at once (make test beside make bench, a cluster build) made the second fail on
# apt's lock ("Could not get lock /var/lib/apt/lists/lock"). It also waits for the dpkg lock
# of an apt-get that is not ours, up to 10 minutes.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
exec flock -w 1800 /tmp/boxcar-apt.lock apt-get -o DPkg::Lock::Timeout=600 "$@"
