# shellcheck shell=sh
# Moves files: sh -c "$(file.sh)" boxcar-file OP NONCE WORKDIR PATH [MAXBYTES]
# A failure is one line on stderr, "boxcar-NONCE: REASON", and exit code 125: REASON is a word
# of the script's, or "os: " and the failing tool's last words, its errno's text, which the
# worker classes as bubblewrap classes the same errno (podErrnos).
op=$1 m=$2 w=$3 f=$4
fail() { echo "boxcar-$m: $1" >&2; exit 125; }
# failos reports a tool's message by what follows its last ": " (strerror's text).
failos() { [ -n "$1" ] || fail ioerror; fail "os: ${1##*: }"; }
# there fails, with the lookup's errno, unless $1 can be looked up (a dangling link can).
there() { e=$(stat -c %n -- "$1" 2>&1 >/dev/null) || failos "$e"; }
W=$(cd -- "$w" 2>/dev/null && pwd -P) || fail notfound
p=$W/$f
inside() { case "$1/" in "$W"/*) return 0;; esac; return 1; }
case $op in
read|open)
	there "$p"
	r=$(readlink -f -- "$p" 2>/dev/null) || fail escape
	inside "$r" || fail escape
	[ -e "$r" ] || fail notfound
	[ -d "$r" ] && fail isdir
	[ -f "$r" ] || fail notregular
	# open takes no link at all, not even one inside: the path must resolve to itself.
	if [ "$op" = open ] && [ "$r" != "$p" ]; then fail escape; fi
	# A file the job made unreadable is its own doing: said so, not as the shell's words.
	[ -r "$r" ] || fail denied
	s=$(wc -c < "$r") || fail notfound
	[ "$s" -le "$5" ] || fail toolarge
	exec cat -- "$r";;
write)
	d=$(dirname -- "$p")
	a=$d
	while [ ! -e "$a" ] && [ ! -L "$a" ]; do a=$(dirname -- "$a"); done
	ra=$(readlink -f -- "$a" 2>/dev/null) || fail escape
	inside "$ra" || fail escape
	mkdir -p -- "$d" 2>/dev/null
	# What mkdir could not make is told by the folder's lookup, as bubblewrap's openat does.
	rd=$(cd -- "$d" 2>/dev/null && pwd -P) || { there "$d/."; fail notfound; }
	inside "$rd" || fail escape
	b=$(basename -- "$p")
	[ -d "$rd/$b" ] && [ ! -L "$rd/$b" ] && fail isdir
	tmp=$rd/.boxcar-write-$m
	e=$({ cat > "$tmp"; } 2>&1) || { rm -f -- "$tmp"; failos "$e"; }
	[ -L "$rd/$b" ] && rm -f -- "$rd/$b"
	e=$(mv -f -- "$tmp" "$rd/$b" 2>&1) || { rm -f -- "$tmp"; failos "$e"; };;
list)
	there "$p"
	r=$(readlink -f -- "$p" 2>/dev/null) || fail escape
	inside "$r" || fail escape
	[ -e "$r" ] || fail notfound
	[ -d "$r" ] || fail notdir
	r=$(cd -- "$r" && pwd -P) || fail notfound
	inside "$r" || fail escape
	printf '%s\0' "$r"
	# A folder find cannot read ends the listing with a "!" record: the files found still count.
	find "$r/" -type f -exec sh -c 'for x do printf "%s %s\0%s\0" "$(stat -c %s -- "$x")" "$(stat -c %a -- "$x")" "$x"; done' sh {} + 2>/dev/null ||
		printf '!\0%s\0' "find could not read every folder";;
esac
