package agent

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClip(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		max      int
		wantCut  bool
		wantHead string
		wantTail string
	}{
		{name: "fits", in: "hello", max: 256, wantCut: false, wantHead: "hello"},
		{name: "exactly the limit", in: strings.Repeat("a", 256), max: 256, wantCut: false},
		{name: "one byte over", in: strings.Repeat("a", 257), max: 256, wantCut: true},
		{name: "head and tail kept", in: "HEAD" + strings.Repeat("x", 10000) + "TAIL", max: 300, wantCut: true, wantHead: "HEAD", wantTail: "TAIL"},
		{name: "large cut", in: strings.Repeat("y", 5<<20), max: 16384, wantCut: true},
		{name: "multi-byte characters", in: strings.Repeat("é€😀", 2000), max: 301, wantCut: true},
		{name: "marker near a power of ten", in: strings.Repeat("z", 10256+26), max: 256, wantCut: true},
		// The bound is on the text as JSON writes it, where these take 6 bytes or 2 each.
		{name: "control bytes", in: "HEAD" + strings.Repeat("\x01", 10000) + "TAIL", max: 300, wantCut: true, wantHead: "HEAD", wantTail: "TAIL"},
		{name: "invalid UTF-8", in: strings.Repeat("\xff", 10000), max: 300, wantCut: true},
		{name: "html characters", in: strings.Repeat("<&>", 10000), max: 300, wantCut: true},
		{name: "backslashes and newlines", in: strings.Repeat("\\\n", 10000), max: 300, wantCut: true},
		{name: "line separators", in: strings.Repeat("\u2028", 10000), max: 300, wantCut: true},
		{name: "fits in bytes, not in JSON", in: strings.Repeat("\x01", 200), max: 256, wantCut: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, cut := clip([]byte(tt.in), tt.max)
			if cut != tt.wantCut {
				t.Fatalf("cut = %v, want %v", cut, tt.wantCut)
			}
			if n := jsonText(got); n > tt.max {
				t.Errorf("len in JSON = %d, over the limit %d", n, tt.max)
			}
			if !cut {
				if got != tt.in {
					t.Errorf("got %q, want the input unchanged", got)
				}
				return
			}
			if !utf8.ValidString(got) && utf8.ValidString(tt.in) {
				t.Errorf("the clipped text is not valid UTF-8")
			}
			if !strings.HasPrefix(got, tt.wantHead) || !strings.HasSuffix(got, tt.wantTail) {
				t.Errorf("got %.40q…, want head %q and tail %q", got, tt.wantHead, tt.wantTail)
			}
			i := strings.Index(got, "\n…[")
			j := strings.Index(got, " bytes cut]…\n")
			if i < 0 || j < i {
				t.Fatalf("no marker in %.80q", got)
			}
			head, tail := got[:i], got[j+len(" bytes cut]…\n"):]
			if !strings.HasPrefix(tt.in, head) || !strings.HasSuffix(tt.in, tail) {
				t.Error("head or tail is not the input's")
			}
			if n := got[i+len("\n…[") : j]; n != strconv.Itoa(len(tt.in)-len(head)-len(tail)) {
				t.Errorf("marker says %s bytes cut, really %d", n, len(tt.in)-len(head)-len(tail))
			}
			if n := jsonText(got); tt.max >= 256 && n < tt.max-16 { // head and tail may each leave a 6-byte escape out
				t.Errorf("len in JSON = %d: the budget %d is wasted", n, tt.max)
			}
		})
	}
}

// TestClipWithoutRoomForTheMarker: a bound too small for the marker keeps a head of whole
// characters; it was cut at the bound, inside the character there.
func TestClipWithoutRoomForTheMarker(t *testing.T) {
	got, cut := clip([]byte("ab€€€€€€€€€€€€€€€€€€€€€€€€€€€€€€"), 4)
	if !cut || got != "ab" {
		t.Errorf("clip to 4 bytes = %q, %v; want \"ab\", cut", got, cut)
	}
}

// jsonText is the length of s in a JSON string as encoding/json writes it, its quotes aside.
func jsonText(s string) int {
	b, _ := json.Marshal(s)
	return len(b) - 2
}

// TestJSONLen holds jsonLen to encoding/json, byte by byte and on mixed texts.
func TestJSONLen(t *testing.T) {
	texts := []string{"", "plain", "é€😀", "\xff\xfe", "\xe2\x82", "\xe2\x82\x82\xac", "\u2028\u2029", "<script>&amp;", "\"\\/", "\b\f\n\r\t\x00\x1f\x7f"}
	for c := range 256 {
		texts = append(texts, string([]byte{byte(c)}), "a"+string([]byte{byte(c)})+"é")
	}
	for _, s := range texts {
		if got, want := jsonLen(s), jsonText(s); got != want {
			t.Errorf("jsonLen(%q) = %d, encoding/json writes %d", s, got, want)
		}
	}
}

func TestNormalizeArgs(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{name: "object", in: `{"a":1}`, want: `{"a":1}`},
		{name: "empty", in: "", want: "{}"},
		{name: "blank", in: "  \n", want: "{}"},
		{name: "null", in: "null", want: "{}"},
		{name: "double encoded", in: `"{\"a\": 1}"`, want: `{"a": 1}`},
		{name: "a plain string stays invalid", in: `"hello"`, want: `"hello"`},
		{name: "garbage stays garbage", in: `{"a":`, want: `{"a":`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := normalizeArgs(tt.in); got != tt.want {
				t.Errorf("normalizeArgs(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// TestAllowPattern: an allowlist pattern's words match argv's elements one for one, so no
// element passes for several: an argv[0] holding a space is one program, whatever it reads
// like joined.
func TestAllowPattern(t *testing.T) {
	tests := []struct {
		name, pattern string
		argv          []string
		want          bool
	}{
		{name: "literal", pattern: "git status", argv: []string{"git", "status"}, want: true},
		{name: "anchored end", pattern: "git status", argv: []string{"git", "status", "--porcelain"}, want: false},
		{name: "anchored start", pattern: "status", argv: []string{"git", "status"}, want: false},
		{name: "star within a word crosses slashes", pattern: "python3 scripts/*.py *", argv: []string{"python3", "scripts/a/b.py", "--x", "1"}, want: true},
		{name: "star within a word stays in its element", pattern: "python3 scripts/*.py *", argv: []string{"python3", "scripts/a", "b.py", "x"}, want: false},
		{name: "last star needs an element", pattern: "ls *", argv: []string{"ls"}, want: false},
		{name: "last star takes any elements", pattern: "ls *", argv: []string{"ls", "-l", "a b", ""}, want: true},
		{name: "star word in the middle is one element", pattern: "git * --help", argv: []string{"git", "log", "--oneline", "--help"}, want: false},
		{name: "program holding a space", pattern: "ls *", argv: []string{"ls /../../bin/sh", "-c", "id"}, want: false},
		{name: "program holding a tab", pattern: "ls *", argv: []string{"ls\t/../../bin/sh"}, want: false},
		{name: "fixed argument holding a space", pattern: "git status", argv: []string{"git status"}, want: false},
		{name: "escaped space is part of the word", pattern: `cat my\ file`, argv: []string{"cat", "my file"}, want: true},
		{name: "escaped space is not two elements", pattern: `cat my\ file`, argv: []string{"cat", "my", "file"}, want: false},
		{name: "runs of white space separate words once", pattern: "git  \tstatus", argv: []string{"git", "status"}, want: true},
		{name: "star alone takes any command", pattern: "*", argv: []string{"anything", "at all"}, want: true},
		{name: "question mark", pattern: "ls -?", argv: []string{"ls", "-l"}, want: true},
		{name: "regexp characters are literal", pattern: "echo a.b", argv: []string{"echo", "axb"}, want: false},
		{name: "escape", pattern: `echo \*`, argv: []string{"echo", "*"}, want: true},
		{name: "escaped star is not a wildcard", pattern: `echo \*`, argv: []string{"echo", "x"}, want: false},
		{name: "newline inside an element", pattern: "echo *", argv: []string{"echo", "a\nb"}, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := compileAllow(tt.pattern)
			if err != nil {
				t.Fatal(err)
			}
			if got := p.match(tt.argv); got != tt.want {
				t.Errorf("%q matches %q = %v, want %v", tt.pattern, tt.argv, got, tt.want)
			}
		})
	}
	for _, empty := range []string{"", " \t "} {
		if _, err := compileAllow(empty); err == nil {
			t.Errorf("compileAllow(%q) succeeded; an empty pattern matches nothing and is refused", empty)
		}
	}
}

// BenchmarkClip measures clipping 1 MiB of output to the default 16 KiB against the baseline
// of copying it into a string, which any caller pays anyway.
func BenchmarkClip(b *testing.B) {
	out := []byte(strings.Repeat("0123456789abcdef\n", 1<<20/17))
	b.Run("baseline-copy", func(b *testing.B) {
		b.SetBytes(int64(len(out)))
		for b.Loop() {
			_ = string(out)
		}
	})
	b.Run("clip-16KiB", func(b *testing.B) {
		b.SetBytes(int64(len(out)))
		for b.Loop() {
			_, _ = clip(out, 16384)
		}
	})
	small := out[:4096]
	b.Run("fits", func(b *testing.B) {
		b.SetBytes(int64(len(small)))
		for b.Loop() {
			_, _ = clip(small, 16384)
		}
	})
}
