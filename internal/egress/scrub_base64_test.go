package egress

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// base64Echoers are the ways a server writes what it got inside a longer base64 run: a token
// minted from a request field, a dump of the request, a JWT's payload.
var base64Echoers = []struct {
	name string
	enc  *base64.Encoding
}{
	{"standard", base64.StdEncoding},
	{"standard, unpadded", base64.RawStdEncoding},
	{"URL", base64.URLEncoding},
	{"URL, unpadded", base64.RawURLEncoding},
}

// base64Run is what a host writes for v with pre bytes before it and suf after, in enc, and
// what the sandbox is to read: the characters that hold the value's bits alone (from the
// first whole one after the pre bytes to the last before the suf ones) as the placeholder's,
// the two at the edges, which mix 2 or 4 of the value's bits with its neighbours', as they are.
func base64Run(enc *base64.Encoding, v, ph string, pre, suf int) (run, want string) {
	before, after := "ab"[:pre], "yz"[:suf]
	run, phRun := enc.EncodeToString([]byte(before+v+after)), enc.EncodeToString([]byte(before+ph+after))
	from, to := (8*pre+5)/6, 8*(pre+len(v))/6
	return run, run[:from] + phRun[from:to] + run[to:]
}

// base64Cores are the value's characters in every alignment and alphabet: what no sink may
// hold.
func base64Cores(v string) map[string]string {
	cores := map[string]string{}
	for _, e := range base64Echoers {
		for pre := range 3 {
			run, _ := base64Run(e.enc, v, v, pre, 0)
			cores[e.name+", after "+strconv.Itoa(pre)] = run[(8*pre+5)/6 : 8*(pre+len(v))/6]
		}
	}
	return cores
}

// decodedHolds reports whether any base64 run in s decodes, in any alphabet, to bytes that
// hold v less its first and last byte (whose edge bits may stay).
func decodedHolds(s, v string) bool {
	inner := v[1 : len(v)-1]
	for _, run := range regexp.MustCompile(`[A-Za-z0-9+/_=-]{8,}`).FindAllString(s, -1) {
		for _, e := range base64Echoers {
			for skip := range 4 { // the run may begin mid-quantum
				raw := strings.TrimRight(run[min(skip, len(run)):], "=")
				raw = raw[:len(raw)/4*4]
				if b, err := e.enc.Strict().WithPadding(base64.NoPadding).DecodeString(raw); err == nil && strings.Contains(string(b), inner) {
					return true
				}
			}
		}
	}
	return false
}

// TestScrubBase64Echoes: a bound host that echoes a value inside a longer base64 run, in the
// standard or URL alphabet, padded or not, after 0, 1 or 2 bytes of its own (the three
// alignments) hands the sandbox the placeholder's characters where the value's alone were,
// however the body is cut; decoded, what the sandbox reads holds none of the value but the
// edge bits. Only Basic credentials were caught: the value went to the sandbox whole.
func TestScrubBase64Echoes(t *testing.T) {
	for _, v := range []string{realToken, encodedSecret} {
		ph, err := placeholderFor(v)
		if err != nil {
			t.Fatal(err)
		}
		swaps := tunnelSwaps([]*secret{{value: v, placeholder: ph}})
		for _, e := range base64Echoers {
			for pre := range 3 {
				for suf := range 3 {
					run, want := base64Run(e.enc, v, ph, pre, suf)
					t.Run(e.name+"/"+v[:5]+"/"+strconv.Itoa(pre)+strconv.Itoa(suf), func(t *testing.T) {
						body, wantBody := `{"token":"`+run+`"}`, `{"token":"`+want+`"}`
						got := string(scrubBytes([]byte(body), compileAll(swaps)))
						if got != wantBody {
							t.Fatalf("the sandbox read %s, want %s", got, wantBody)
						}
						for how, c := range base64Cores(v) {
							if strings.Contains(got, c) {
								t.Fatalf("the sandbox read the value in base64, %s", how)
							}
						}
						if decodedHolds(got, v) {
							t.Fatal("the sandbox read the value, decoded")
						}
						if pre == suf { // every cut: a run whose alignment the cuts vary
							checkEveryCut(t, swaps, body, wantBody)
						}
					})
				}
			}
		}
	}
}

// echoBase64Handler is a bound host that hands X-Echo back inside base64 runs: one body line
// per base64Echoers row and alignment, cut into two writes at ?cut, and in a header field.
func echoBase64Handler(got chan<- string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, cut := echoRequest(r, got)
		body, _ := base64Echo(v, v)
		run, _ := base64Run(base64.RawURLEncoding, v, v, 1, 2)
		w.Header().Set("X-Token", run)
		writeCut(w, body, cut)
	}
}

// base64Echo is the body echoBase64Handler writes for v, and what the sandbox is to read of
// it for the placeholder ph.
func base64Echo(v, ph string) (body, want string) {
	var b, wb strings.Builder
	for _, e := range base64Echoers {
		for pre := range 3 {
			run, w := base64Run(e.enc, v, ph, pre, 2-pre)
			b.WriteString(run + "\n")
			wb.WriteString(w + "\n")
		}
	}
	return b.String(), wb.String()
}

// TestBase64EchoReachesTheSandboxAsItsPlaceholder: through the proxy, a bound host echoing a
// secret inside base64 runs, in its body cut at many points and in a header field, hands the
// sandbox the placeholder's characters there, and no sink (what the sandbox read, decoded too,
// the decisions, the summary, the log, the metrics) holds the value in any encoding.
func TestBase64EchoReachesTheSandboxAsItsPlaceholder(t *testing.T) {
	got := make(chan string, 1)
	h, ph, client := echoThroughProxy(t, echoBase64Handler(got))
	body, want := base64Echo(encodedSecret, ph)
	_, wantField := base64Run(base64.RawURLEncoding, encodedSecret, ph, 1, 2)
	var seen strings.Builder
	for cut := 0; cut <= len(body); cut += 7 {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "https://api.example.com/b64?cut="+strconv.Itoa(cut), nil)
		req.Header.Set("X-Echo", ph)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("cut %d: %v", cut, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("cut %d: %v", cut, err)
		}
		if string(b) != want || resp.Header.Get("X-Token") != wantField {
			t.Fatalf("cut %d: the sandbox read %q and X-Token %q; want %q and %q", cut, b, resp.Header.Get("X-Token"), want, wantField)
		}
		_ = resp.Header.Write(&seen)
		seen.Write(b)
	}
	if v := <-got; v != encodedSecret {
		t.Fatalf("the bound host got %d bytes, not the value: the test would prove nothing", len(v))
	}
	checkNoSinkHolds(t, h, seen.String(), base64Cores(encodedSecret), true)
}
