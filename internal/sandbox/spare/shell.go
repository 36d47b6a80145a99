package spare

import "errors"

// The shell spare: where the sandbox's /bin/sh is dash, a warm sandbox's first command starts
// from `/bin/sh -c Script` instead of the worker's binary. A Go program has 3-5 threads
// whatever it does, and execve waits until every other thread has been scheduled and has
// exited, which on a loaded CPU (and under the sandbox's CPU quota) took most of a warm
// command's start (docs/performance.md, row 14); dash has one thread, starts in about a
// millisecond and holds no descriptor of its own.
//
// Script is fixed: nothing of a job is ever part of it. It says it is ready with a byte on
// descriptor ReadyFD and closes that, then reads one line from stdin, the request: words the
// worker quoted (Request), which the shell only ever sees as single-quoted text. It then does
// what bwrap does before it executes a command, with bwrap's own words when it fails: enters
// the folder ("bwrap: Can't chdir to DIR: REASON", exit 1), takes stdin from /dev/null when
// the command has no input, finds the program as execvp(3) does on the command's PATH
// ("bwrap: execvp NAME: REASON", exit 1), and only then sets exactly the command's
// environment (bwrap's PWD included; the OLDPWD its cd set removed) and executes it in its own
// place. Every step is one of dash's builtins, so no process is forked: the command is pid 2,
// and its own children are numbered from 3, as under a cold bwrap. Only the program's search is
// done twice (here and by exec): a file that changes in between gives dash's error (exit 126
// or 127) instead of bwrap's.
//
// Two things a shell cannot do are the caller's: it reads descriptors up to 9 only, so
// ReadyFD is 9 and the sandbox's other descriptors must lie below it; and it lists the
// environment in its own order (a hash of the names), not bwrap's (sorted, PWD last), which
// only a program that reads /proc/self/environ in order can tell.
const Script = `echo >&9 || exit 1
exec 9>&-
nl='
'
IFS= read -r r || exit 0
eval "set -- $r"
fail() { printf 'bwrap: %s\n' "$1" >&2; exit 1; }
why() {
	w='No such file or directory'
	if [ -e "$1" ]; then
		w='Permission denied'
		[ -z "$2" ] || [ -d "$1" ] || w='Not a directory'
		return
	fi
	q=$1
	while case $q in */?*) true ;; *) false ;; esac; do
		q=${q%/*}
		if [ -e "$q" ]; then
			[ -d "$q" ] || w='Not a directory'
			return
		fi
	done
}
runs() { [ -f "$1" ] && [ -x "$1" ]; }
cd -P -- "$1" 2>/dev/null || { why "$1" dir; fail "Can't chdir to $1: $w"; }
[ "$2" = 1 ] || exec </dev/null
case $4 in
*/*) runs "$4" || { why "$4"; fail "execvp $4: $w"; } ;;
*)
	p=$3 w='No such file or directory'
	while d=${p%%:*}; ! runs "${d:-.}/$4"; do
		[ ! -e "${d:-.}/$4" ] || w='Permission denied'
		case $p in
		*:*) p=${p#*:} ;;
		*) fail "execvp $4: $w" ;;
		esac
	done
	;;
esac
unset OLDPWD
shift 4
while [ "$1" != -- ]; do export "$1"; shift; done
shift
exec "$@"
`

// ReadyFD is the descriptor on which Script says it is ready: the highest a shell's
// redirections reach.
const ReadyFD = 9

// MaxRequest is the longest request Script is given, in bytes. A shell reads a line one byte
// at a time (so as not to take the command's input with it), about a microsecond a byte: past
// 8 KiB, a bwrap of the command's own starts it about as soon.
const MaxRequest = 8 << 10

// errNUL: neither a program's arguments nor its environment can hold a NUL byte.
var errNUL = errors.New("a NUL byte cannot be passed to a program")

// Request is the line Script reads for a command: the folder, "1" when the command has input,
// the PATH it is searched on, argv[0], then the environment (NAME=value, each NAME a shell
// name), "--" and argv, each word single-quoted (a quote becomes '\” and a newline '"$nl"',
// so that the request is one line), ended by a newline.
func Request(argv, env []string, dir string, stdin bool, path string) ([]byte, error) {
	if len(argv) == 0 {
		return nil, errors.New("no program")
	}
	in := "0"
	if stdin {
		in = "1"
	}
	words := append([]string{dir, in, path, argv[0]}, env...)
	for _, kv := range env {
		if !shellAssignment(kv) {
			return nil, errors.New("environment entry " + kv + " is not NAME=value with NAME of letters, digits and _")
		}
		if len(kv) >= len("OPTIND=") && kv[:len("OPTIND=")] == "OPTIND=" && !smallNumber(kv[len("OPTIND="):]) {
			return nil, errors.New("dash exports OPTIND only as a number") // and exits on any other
		}
	}
	words = append(append(words, "--"), argv...)
	var b []byte
	for i, w := range words {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, '\'')
		for j := range len(w) {
			switch w[j] {
			case 0:
				return nil, errNUL
			case '\'':
				b = append(b, `'\''`...)
			case '\n':
				b = append(b, `'"$nl"'`...)
			default:
				b = append(b, w[j])
			}
		}
		b = append(b, '\'')
	}
	if len(b) >= MaxRequest {
		return nil, errors.New("the request is longer than the shell reads quickly")
	}
	return append(b, '\n'), nil
}

// shellAssignment reports whether kv is NAME=value with NAME a name a shell can export.
func shellAssignment(kv string) bool {
	for i := range len(kv) {
		c := kv[i]
		switch {
		case c == '=':
			return i > 0
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return false
}

// smallNumber reports whether s is digits that dash reads as a number (at most 9 of them).
func smallNumber(s string) bool {
	if len(s) == 0 || len(s) > 9 {
		return false
	}
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
