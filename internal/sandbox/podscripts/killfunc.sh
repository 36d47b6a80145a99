# shellcheck shell=sh
# k NONCE kills a command's tree until none of it is left, and returns 0 only once it has seen
# none left. A shell that cannot fork the grep (a fork bomb fills the pod's process bound) exits
# non-zero. exec.sh and kill.sh are sent with this prepended.
#
# The tree is what carries BOXCAR_EXEC=NONCE, what the command orphaned, and everything beneath
# either. The mark alone is not enough: a process can start a child without it (env -i, env -u).
# An orphan's parent becomes the container's pid 1, the pause script (pause.sh), whose own
# children (its sleep) are in its session; a pods/exec process gets a session of its own from
# the runtime (runc's setsid), which its descendants keep or trade for one of their own, never
# for pid 1's. So an orphan of a command is a child of pid 1 outside pid 1's session. Spared:
# pid 1 and its session, the execs (Boxcar's scripts, the command session; their parent is
# outside the container), this shell, and an orphan that carries the mark of another command
# still running (one whose mark a child of an exec carries: the command's root).
k() {
	# Elsewhere than in a Boxcar pod (the tests run the script on their host), pid 1's children
	# are not orphans of a command: only the mark counts.
	z=
	grep -q -s -F boxcar-pause /proc/1/cmdline && z=1
	i=0
	while [ "$i" -lt 20 ]; do
		p=
		# shellcheck disable=SC2013 # grep -l prints /proc/PID/environ names: no blanks in them
		for f in $(grep -l -s -z -x -F "BOXCAR_EXEC=$1" /proc/[0-9]*/environ); do
			f=${f#/proc/}
			p="$p ${f%/environ}"
		done
		if [ -n "$z" ] && kscan; then
			korphans "$1"
			kbeneath
		fi
		[ -z "$p" ] && return
		# shellcheck disable=SC2086 # $p is a list of pids, split on purpose
		kill -STOP $p
		# shellcheck disable=SC2086
		kill -9 $p
		i=$((i+1))
	done
	return 1
} 2>/dev/null

# kscan reads every live process's parent into t (" PID:PPID ..."), and into o the orphans:
# children of pid 1 outside its session, but for this shell; a zombie is neither (pid 1 reaps
# it). Builtins only: no process to fork.
kscan() {
	read -r s </proc/1/stat || return
	# shellcheck disable=SC2086 # the fields after "(comm) ", split on purpose
	set -- ${s##*") "}
	r=$4
	read -r s </proc/self/stat || return
	me=${s%% *}
	t='' o=''
	for f in /proc/[0-9]*/stat; do
		read -r s <"$f" || continue
		q=${s%% *}
		# shellcheck disable=SC2086
		set -- ${s##*") "}
		[ "$1" = Z ] && continue
		t="$t $q:$2"
		if [ "$2" = 1 ] && [ "$4" != "$r" ] && [ "$q" != "$me" ]; then o="$o $q"; fi
	done
	t="$t "
}

# korphans NONCE adds to p the orphans in o but those carrying another live command's mark.
# One grep finds those carrying a mark at all; usually none do.
korphans() {
	[ -z "$o" ] && return
	f=
	for q in $o; do f="$f /proc/$q/environ"; done
	g=' '
	# shellcheck disable=SC2086,SC2013 # a list of file names, split on purpose
	for f in $(grep -l -s -z '^BOXCAR_EXEC=' $f); do g="$g$f "; done
	for q in $o; do
		case $g in *" /proc/$q/environ "*) klive "$1" "$q" && continue ;; esac
		p="$p $q"
	done
}

# klive NONCE PID: PID carries the mark of a command other than NONCE's that still runs: the
# mark is carried by a child of an exec (a process whose parent is outside the container),
# which no process of a command can become.
klive() {
	m=$(grep -s -z -o -m 1 '^BOXCAR_EXEC=.*' "/proc/$2/environ")
	[ -n "$m" ] && [ "$m" != "BOXCAR_EXEC=$1" ] || return 1
	# shellcheck disable=SC2013 # grep -l prints /proc/PID/environ names: no blanks in them
	for f in $(grep -l -s -z -x -F "$m" /proc/[0-9]*/environ); do
		f=${f#/proc/}
		w=$(kparent "${f%/environ}") && [ "$w" != 0 ] && [ "$(kparent "$w")" = 0 ] && return 0
	done
	return 1
}

# kparent PID prints PID's parent as kscan read it.
kparent() {
	case $t in *" $1:"*) ;; *) return 1 ;; esac
	v=${t#*" $1:"}
	echo "${v%% *}"
}

# kbeneath adds to p every process beneath one in p, as kscan read them; never this shell.
kbeneath() {
	n=1
	while [ -n "$n" ]; do
		n=
		for e in $t; do
			case " $p " in *" ${e%:*} "*) continue ;; esac
			case " $p " in *" ${e#*:} "*) [ "${e%:*}" != "$me" ] && p="$p ${e%:*}" && n=1 ;; esac
		done
	done
}
