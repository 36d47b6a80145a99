package egress

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// chunkBody hands out its chunks one per Read, and counts what it gave.
type chunkBody struct {
	chunks []string
	given  int
}

func (b *chunkBody) Read(p []byte) (int, error) {
	if len(b.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, b.chunks[0])
	b.chunks[0] = b.chunks[0][n:]
	if b.chunks[0] == "" {
		b.chunks = b.chunks[1:]
	}
	b.given += n
	return n, nil
}

func (b *chunkBody) Close() error { return nil }

// scrubChunks streams chunks through a scrubbed answer's body (of pats, compiled once for
// every cut) and returns what its reader got; it fails the test when, after a read, the
// scrubber holds back more than the longest value's longest form less one.
func scrubChunks(t *testing.T, pats []*pattern, chunks []string) string {
	t.Helper()
	up := &chunkBody{chunks: chunks}
	body, hold := newScrubBody(up, pats, nil), heldLen(pats)
	var got bytes.Buffer
	buf := make([]byte, 64<<10)
	for {
		n, err := body.Read(buf)
		got.Write(buf[:n])
		if held := up.given - got.Len(); err == nil && held > hold {
			t.Fatalf("chunks %q: %d bytes held back after a read, more than the longest form less one (%d)", chunks, held, hold)
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			return got.String()
		}
	}
}

// TestScrubBodyCatchesEveryCut: a body holding values (one inside another, one twice, one
// at each end) is scrubbed whole however the upstream cuts it, at any one point, any two and any three,
// the scrubber holding back no more than the longest value less one after each read and
// handing out everything by the end. The values are what the tunnel's secrets put upstream;
// none may reach the sandbox, nor any part of one as a part of another.
func TestScrubBodyCatchesEveryCut(t *testing.T) {
	swaps := []swap{
		{real: []byte("s3cr3t"), ph: []byte("PH-one")},
		{real: []byte("tok-s3cr3t-long"), ph: []byte("PH-two-two-two-")},
		{real: []byte("zz"), ph: []byte("Pz")},
	}
	tests := []struct{ name, body, want string }{
		{"one value", "id=s3cr3t;", "id=PH-one;"},
		{"a value inside another", "x tok-s3cr3t-long y", "x PH-two-two-two- y"},
		{"values at both ends and twice", "s3cr3t..zz..s3cr3t zz", "PH-one..Pz..PH-one Pz"},
		{"a value cut short, then whole", "s3cr3 s3cr3t", "s3cr3 PH-one"},
		{"the whole body a value", "tok-s3cr3t-long", "PH-two-two-two-"},
		{"no value", "nothing secret here", "nothing secret here"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkEveryCut(t, swaps, tt.body, tt.want) })
	}
}

// checkEveryCut streams body through scrubChunks cut at every point, every two and (for a body
// of up to 32 bytes: an encoded one's would take minutes) every three points, and a byte a
// read, and fails unless the sandbox reads want every time and no value whole.
func checkEveryCut(t *testing.T, swaps []swap, b, want string) {
	t.Helper()
	pats := compileAll(swaps)
	check := func(chunks []string) {
		t.Helper()
		got := scrubChunks(t, pats, append([]string(nil), chunks...))
		if got != want {
			t.Fatalf("chunks %q: the sandbox read %q, want %q", chunks, got, want)
		}
		for _, s := range swaps {
			if strings.Contains(got, string(s.real)) {
				t.Fatalf("chunks %q: %q reached the sandbox", chunks, s.real)
			}
		}
	}
	check([]string{b})
	for i := 0; i <= len(b); i++ {
		check([]string{b[:i], b[i:]})
		for j := i; j <= len(b); j++ {
			check([]string{b[:i], b[i:j], b[j:]})
			// Three cuts: a value in four reads, spread over more than the hold.
			for k := j; k <= len(b) && len(b) <= 32; k++ {
				check([]string{b[:i], b[i:j], b[j:k], b[k:]})
			}
		}
	}
	// A byte a read, as a slow host streams.
	check(strings.Split(b, ""))
}
