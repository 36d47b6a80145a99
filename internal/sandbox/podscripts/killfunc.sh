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
#
# Its variables are all k_...: sh has no local ones, and the script this is prepended to keeps
# its own (exec.sh's watchdog trap killed the pid in s, which the scan had set to a /proc line).
k() {
	# Elsewhere than in a Boxcar pod (the tests run the script on their host), pid 1's children
	# are not orphans of a command: only the mark counts.
	k_z=
	grep -q -s -F boxcar-pause /proc/1/cmdline && k_z=1
	k_i=0
	while [ "$k_i" -lt 20 ]; do
		k_p=
		# shellcheck disable=SC2013 # grep -l prints /proc/PID/environ names: no blanks in them
		for k_f in $(grep -l -s -z -x -F "BOXCAR_EXEC=$1" /proc/[0-9]*/environ); do
			k_f=${k_f#/proc/}
			k_p="$k_p ${k_f%/environ}"
		done
		if [ -n "$k_z" ] && kscan; then
			korphans "$1"
			kbeneath
		fi
		[ -z "$k_p" ] && return
		# shellcheck disable=SC2086 # $k_p is a list of pids, split on purpose
		kill -STOP $k_p
		# shellcheck disable=SC2086
		kill -9 $k_p
		k_i=$((k_i+1))
	done
	return 1
} 2>/dev/null

# kscan reads every live process's parent into k_t (" PID:PPID ..."), and into k_o the orphans:
# children of pid 1 outside its session, but for this shell; a zombie is neither (pid 1 reaps
# it). Builtins only: no process to fork.
kscan() {
	read -r k_s </proc/1/stat || return
	# shellcheck disable=SC2086 # the fields after "(comm) ", split on purpose
	set -- ${k_s##*") "}
	k_r=$4
	read -r k_s </proc/self/stat || return
	k_me=${k_s%% *}
	k_t='' k_o=''
	for k_f in /proc/[0-9]*/stat; do
		read -r k_s <"$k_f" || continue
		k_q=${k_s%% *}
		# shellcheck disable=SC2086
		set -- ${k_s##*") "}
		[ "$1" = Z ] && continue
		k_t="$k_t $k_q:$2"
		if [ "$2" = 1 ] && [ "$4" != "$k_r" ] && [ "$k_q" != "$k_me" ]; then k_o="$k_o $k_q"; fi
	done
	k_t="$k_t "
}

# korphans NONCE adds to k_p the orphans in k_o but those carrying another live command's mark.
# One grep finds those carrying a mark at all; usually none do.
korphans() {
	[ -z "$k_o" ] && return
	k_f=
	for k_q in $k_o; do k_f="$k_f /proc/$k_q/environ"; done
	k_g=' '
	# shellcheck disable=SC2086,SC2013 # a list of file names, split on purpose
	for k_f in $(grep -l -s -z '^BOXCAR_EXEC=' $k_f); do k_g="$k_g$k_f "; done
	for k_q in $k_o; do
		case $k_g in *" /proc/$k_q/environ "*) klive "$1" "$k_q" && continue ;; esac
		k_p="$k_p $k_q"
	done
}

# klive NONCE PID: PID carries the mark of a command other than NONCE's that still runs: the
# mark is carried by a child of an exec (a process whose parent is outside the container),
# which no process of a command can become.
klive() {
	k_m=$(grep -s -z -o -m 1 '^BOXCAR_EXEC=.*' "/proc/$2/environ")
	[ -n "$k_m" ] && [ "$k_m" != "BOXCAR_EXEC=$1" ] || return 1
	# shellcheck disable=SC2013 # grep -l prints /proc/PID/environ names: no blanks in them
	for k_f in $(grep -l -s -z -x -F "$k_m" /proc/[0-9]*/environ); do
		k_f=${k_f#/proc/}
		k_w=$(kparent "${k_f%/environ}") && [ "$k_w" != 0 ] && [ "$(kparent "$k_w")" = 0 ] && return 0
	done
	return 1
}

# kparent PID prints PID's parent as kscan read it.
kparent() {
	case $k_t in *" $1:"*) ;; *) return 1 ;; esac
	k_v=${k_t#*" $1:"}
	echo "${k_v%% *}"
}

# kbeneath adds to k_p every process beneath one in k_p, as kscan read them; never this shell.
kbeneath() {
	k_n=1
	while [ -n "$k_n" ]; do
		k_n=
		for k_e in $k_t; do
			case " $k_p " in *" ${k_e%:*} "*) continue ;; esac
			case " $k_p " in *" ${k_e#*:} "*) [ "${k_e%:*}" != "$k_me" ] && k_p="$k_p ${k_e%:*}" && k_n=1 ;; esac
		done
	done
}
