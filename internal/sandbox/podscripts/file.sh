# shellcheck shell=sh
# Moves files: sh -c "$(file.sh)" boxcar-file OP NONCE WORKDIR PATH [MAXBYTES]
op=$1 m=$2 w=$3 f=$4
fail() { echo "boxcar-$m: $1" >&2; exit 125; }
W=$(cd -- "$w" 2>/dev/null && pwd -P) || fail notfound
p=$W/$f
inside() { case "$1/" in "$W"/*) return 0;; esac; return 1; }
case $op in
read|open)
	[ -e "$p" ] || [ -L "$p" ] || fail notfound
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
	rd=$(cd -- "$d" 2>/dev/null && pwd -P) || fail notfound
	inside "$rd" || fail escape
	b=$(basename -- "$p")
	[ -d "$rd/$b" ] && [ ! -L "$rd/$b" ] && fail isdir
	tmp=$rd/.boxcar-write-$m
	cat > "$tmp" || { rm -f -- "$tmp"; fail ioerror; }
	[ -L "$rd/$b" ] && rm -f -- "$rd/$b"
	mv -f -- "$tmp" "$rd/$b" || { rm -f -- "$tmp"; fail ioerror; };;
list)
	[ -e "$p" ] || [ -L "$p" ] || fail notfound
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
