package egress

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// stepBody is an upstream body that hands out one write per Read and says when it is asked
// for the next: scrubBody reads upstream only when it has nothing left to hand out, so by then
// its reader has had all it gets before the upstream writes again.
type stepBody struct {
	asked  chan struct{}
	writes chan string
}

func (b *stepBody) Read(p []byte) (int, error) {
	b.asked <- struct{}{}
	w, ok := <-b.writes
	if !ok {
		return 0, io.EOF
	}
	return copy(p, w), nil
}

func (b *stepBody) Close() error { return nil }

// deliveredBeforeEachWrite streams writes through a scrubBody and returns what its reader
// was handed before each write came, and what it got after the last.
func deliveredBeforeEachWrite(t *testing.T, swaps []swap, writes []string) []string {
	t.Helper()
	up := &stepBody{asked: make(chan struct{}), writes: make(chan string)}
	body := newScrubBody(up, compileAll(swaps), nil)
	pieces := make(chan []byte, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := body.Read(buf)
			if n > 0 {
				pieces <- bytes.Clone(buf[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	drain := func() string {
		var got []byte
		for {
			select {
			case p := <-pieces:
				got = append(got, p...)
			default:
				return string(got)
			}
		}
	}
	var out []string
	<-up.asked
	for _, w := range writes {
		up.writes <- w
		<-up.asked
		out = append(out, drain())
	}
	close(up.writes)
	<-done
	return append(out, drain())
}

// TestScrubBodyHoldsByLength: what the scrubber holds back until more comes depends on how
// many bytes came, never on what they are. A bound host that streams back bytes the sandbox
// chose (a log tail, an echo, a progress stream of a job it named), a line per guess, must not
// show the sandbox which guess begins the real value by holding that line back: it would learn
// the value a character at a time. Each stream is compared with one of the same lengths that
// begins no value.
func TestScrubBodyHoldsByLength(t *testing.T) {
	plain := []swap{{real: []byte("REAL-value-0123456789"), ph: []byte("fake-value-9876543210")}}
	// A value with punctuation is looked for in its encoded forms too ("\/", "%2B"), which
	// are longer: the hold is the longest form's, still a length alone.
	punct := []swap{{real: []byte("REAL/value+0123456789"), ph: []byte("fake/value+9876543210")}}
	for _, tt := range []struct {
		swaps          []swap
		known, guesses string
	}{
		{plain, "", "PQRST"},                       // R begins the value
		{plain, "REAL-val", "tuvwx"},               // u is the next character
		{plain, "REAL-value-01234567", "789"},      // 8: one short of the whole value
		{plain, "data: REAL-value-01234", "45678"}, // after other bytes
		{punct, `REAL\/val`, "tuvwx"},              // PHP's JSON
		{punct, "REAL%2Fvalue%2B01234567", "789"},  // percent-encoded, 8 one short
		{punct, "REAL&#x2F;value&#43;0", "012"},    // HTML references
	} {
		swaps := tt.swaps
		var writes, same []string
		for _, c := range tt.guesses {
			w := "\n" + tt.known + string(c)
			writes = append(writes, w)
			same = append(same, strings.Repeat("x", len(w)))
		}
		got, want := deliveredBeforeEachWrite(t, swaps, writes), deliveredBeforeEachWrite(t, swaps, same)
		for i := range got {
			if len(got[i]) != len(want[i]) {
				t.Fatalf("guesses %q after %q: %d bytes reach the sandbox before write %d, %d for bytes of the same lengths that begin no value: the hold tells which guess begins the value",
					tt.guesses, tt.known, len(got[i]), i+1, len(want[i]))
			}
		}
		if all := strings.Join(got, ""); all != strings.Join(writes, "") {
			t.Fatalf("the sandbox read %q, want the stream as it was written", all)
		}
	}
}

// TestScrubbedStreamHoldsByLength: through the proxy, a bound host's streamed answer reaches
// the sandbox less the same number of bytes (the longest value's longest form less one) before the host
// writes again, whether its last bytes begin the real value or not.
func TestScrubbedStreamHoldsByLength(t *testing.T) {
	next := make(chan struct{})
	caPEM, _, leaf := testUpstreamCert(t, "api.example.com")
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "line: "+strings.Repeat("x", 40)+"\n"+r.URL.Query().Get("k"))
		w.(http.Flusher).Flush()
		select {
		case <-next:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "\nend\n")
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	h := setup(t, func(c *Config) {
		c.Dialer.(*stubDialer).routes[apiAddr+":443"] = srv.Listener.Addr().String()
		c.UpstreamCAPEM = caPEM
	})
	client := h.client(t)
	for _, k := range []string{realToken[:20], strings.Repeat("q", 20)} {
		streamHeldBack(t, client, next, k)
	}
}

// streamHeldBack asks the host of TestScrubbedStreamHoldsByLength to stream k and checks what
// reaches the sandbox before the host writes again (on next), and in all.
func streamHeldBack(t *testing.T, client *http.Client, next chan<- struct{}, k string) {
	t.Helper()
	first := "line: " + strings.Repeat("x", 40) + "\n" + k
	// The longest form less one: the value's base64 core, of 4/3 of its bytes.
	want := len(first) - (len(realToken)*4/3 - 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://api.example.com/stream?k="+k, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET the stream: %v", err)
	}
	defer resp.Body.Close()
	got := make([]byte, want)
	if _, err := io.ReadFull(resp.Body, got); err != nil || string(got) != first[:want] {
		t.Fatalf("first %d bytes: %q, %v; want %q", want, got, err, first[:want])
	}
	// Nothing more may come before the host writes again; more is what a hold that depends
	// on the bytes would let through for a guess that begins no value.
	more := readOnce(resp.Body)
	select {
	case b := <-more:
		t.Fatalf("the sandbox got %q more before the host wrote again", b)
	case <-time.After(200 * time.Millisecond):
	}
	next <- struct{}{}
	held := <-more // the read above, which the host's next write ends
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if rest = append(held, rest...); string(got)+string(rest) != first+"\nend\n" {
		t.Fatalf("the sandbox read %q, want %q", string(got)+string(rest), first+"\nend\n")
	}
}

// readOnce reads r once, in the background, and sends what it read.
func readOnce(r io.Reader) <-chan []byte {
	more := make(chan []byte, 1)
	go func() {
		b := make([]byte, 1024)
		n, _ := r.Read(b)
		more <- b[:n]
	}()
	return more
}
