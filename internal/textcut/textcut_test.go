package textcut_test

import (
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/textcut"
)

// euro is a 3-byte character and smile a 4-byte one.
const (
	euro  = "€"
	smile = "😀"
)

// cut is a row of TestHead's and TestTail's tables: in cut to n bytes is want.
type cut struct {
	name string
	in   string
	n    int
	want string
}

// checkCuts checks each row with the string and the []byte form of one cut.
func checkCuts(t *testing.T, name string, ofString func(string, int) string, ofBytes func([]byte, int) []byte, tests []cut) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := ofString(tt.in, tt.n); got != tt.want {
				t.Errorf("%s(%q, %d) = %q, want %q", name, tt.in, tt.n, got, tt.want)
			}
			if got := ofBytes([]byte(tt.in), tt.n); string(got) != tt.want {
				t.Errorf("%s([]byte(%q), %d) = %q, want %q", name, tt.in, tt.n, got, tt.want)
			}
		})
	}
}

func TestHead(t *testing.T) {
	t.Parallel()
	checkCuts(t, "Head", textcut.Head[string], textcut.Head[[]byte], []cut{
		{name: "shorter than the bound", in: "abc", n: 10, want: "abc"},
		{name: "exactly the bound", in: "abc", n: 3, want: "abc"},
		{name: "ascii cut", in: "abcdef", n: 4, want: "abcd"},
		{name: "bound 0", in: "abc", n: 0, want: ""},
		{name: "negative bound", in: "abc", n: -1, want: ""},
		{name: "empty text", in: "", n: 0, want: ""},
		{name: "bound at a character's start", in: "ab" + euro, n: 2, want: "ab"},
		{name: "bound at a character's end", in: "ab" + euro + "c", n: 5, want: "ab" + euro},
		{name: "bound one byte into a character", in: "ab" + euro, n: 3, want: "ab"},
		{name: "bound two bytes into a character", in: "ab" + euro, n: 4, want: "ab"},
		{name: "bound three bytes into a 4-byte character", in: "a" + smile, n: 4, want: "a"},
		{name: "a 2-byte character cut", in: "aé", n: 2, want: "a"},
		{name: "the first character longer than the bound", in: smile + "a", n: 3, want: ""},
		{name: "characters only", in: strings.Repeat(euro, 4), n: 7, want: euro + euro},
		// No character starts within 3 bytes before the bound: there is none to keep whole,
		// and the cut is at the bound. Walking back to the last start kept only "a".
		{name: "invalid UTF-8: continuation bytes only", in: "a" + strings.Repeat("\x80", 10), n: 8, want: "a" + strings.Repeat("\x80", 7)},
		{name: "invalid UTF-8: a stray byte before the bound", in: "ab\xffcd", n: 3, want: "ab\xff"},
		{name: "invalid UTF-8: a lead byte with nothing after", in: "ab\xe2cd", n: 3, want: "ab\xe2"},
	})
}

func TestTail(t *testing.T) {
	t.Parallel()
	checkCuts(t, "Tail", textcut.Tail[string], textcut.Tail[[]byte], []cut{
		{name: "shorter than the bound", in: "abc", n: 10, want: "abc"},
		{name: "exactly the bound", in: "abc", n: 3, want: "abc"},
		{name: "ascii cut", in: "abcdef", n: 4, want: "cdef"},
		{name: "bound 0", in: "abc", n: 0, want: ""},
		{name: "bound at a character's start", in: euro + "ab", n: 5, want: euro + "ab"},
		{name: "bound one byte into a character", in: euro + "ab", n: 4, want: "ab"},
		{name: "bound into a 4-byte character", in: smile + "a", n: 2, want: "a"},
		{name: "the last character longer than the bound", in: "a" + smile, n: 3, want: ""},
		{name: "invalid UTF-8: continuation bytes only", in: strings.Repeat("\x80", 10) + "a", n: 8, want: strings.Repeat("\x80", 7) + "a"},
	})
}

// TestHeadAndTail: a text cut in the middle keeps a head and a tail, each whole characters,
// together within the bound; what is cut is the rest.
func TestHeadAndTail(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name             string
		in               string
		n                int
		wantHead, wantTl string
	}{
		{name: "ascii", in: "HEADxxxxxxxxTAIL", n: 8, wantHead: "HEAD", wantTl: "TAIL"},
		{name: "characters on both cuts", in: "a" + euro + strings.Repeat("x", 20) + euro + "b", n: 6, wantHead: "a", wantTl: "b"},
		{name: "4-byte characters", in: strings.Repeat(smile, 10), n: 10, wantHead: smile, wantTl: smile},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			head, tail := textcut.Head(tt.in, tt.n-tt.n/2), textcut.Tail(tt.in, tt.n/2)
			if head != tt.wantHead || tail != tt.wantTl || len(head)+len(tail) > tt.n {
				t.Errorf("head %q, tail %q; want %q and %q within %d bytes", head, tail, tt.wantHead, tt.wantTl, tt.n)
			}
		})
	}
}
