package egress

import (
	"encoding/base64"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestScrubOverlappingValues: two values that share bytes where they meet in an answer (the
// tail of one is the head of the other, or a value overlaps itself) leave no byte of either in
// clear, in a header field, the status line or a body however it is cut. Each byte of every
// value the answer holds, found in the bytes as the upstream sent them, becomes a placeholder
// byte: the longer value's placeholder is whole, the shorter's is what the longer left of it.
// Replacing one value first used to hide the other from the search, and its rest reached the
// sandbox: the head or tail of a value, which a second answer could complete.
func TestScrubOverlappingValues(t *testing.T) {
	tests := []struct {
		name       string
		swaps      []swap
		body, want string
	}{
		{"the tail of a shorter value begins a longer one",
			[]swap{{real: []byte("alpha-KEY1"), ph: []byte("xxxxx-XXX9")}, {real: []byte("KEY1-omega-long"), ph: []byte("YYY8-yyyyy-yyyy")}},
			"<alpha-KEY1-omega-long>", "<xxxxx-YYY8-yyyyy-yyyy>"},
		{"the tail of a longer value begins a shorter one",
			[]swap{{real: []byte("long-prefix-KEY2"), ph: []byte("zzzz-zzzzzz-ZZZ7")}, {real: []byte("KEY2-tail"), ph: []byte("WWW6-wwww")}},
			"[long-prefix-KEY2-tail]", "[zzzz-zzzzzz-ZZZ7-wwww]"},
		{"values of one length overlapping",
			[]swap{{real: []byte("same-KEY3"), ph: []byte("nnnn-NNN5")}, {real: []byte("KEY3-same"), ph: []byte("MMM4-mmmm")}},
			"same-KEY3-same", "nnnn-MMM4-mmmm"},
		{"a value overlapping itself",
			[]swap{{real: []byte("ab12ab12"), ph: []byte("cd34ef56")}},
			"ab12ab12ab12", "cd34cd34ef56"},
		{"a longer value overlapping a shorter one at each end",
			[]swap{{real: []byte("head-K1"), ph: []byte("hhhh-H7")}, {real: []byte("K1-middle-K2"), ph: []byte("I8-iiiiii-I9")}, {real: []byte("K2-tail"), ph: []byte("J6-jjjj")}},
			"head-K1-middle-K2-tail", "hhhh-I8-iiiiii-I9-jjjj"},
		{"an overlap beside the same value alone",
			[]swap{{real: []byte("alpha-KEY1"), ph: []byte("xxxxx-XXX9")}, {real: []byte("KEY1-omega-long"), ph: []byte("YYY8-yyyyy-yyyy")}},
			"alpha-KEY1 alpha-KEY1-omega-long", "xxxxx-XXX9 xxxxx-YYY8-yyyyy-yyyy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := &http.Response{Status: "400 " + tt.body, Header: http.Header{"X-Echo": {tt.body}}, Body: http.NoBody}
			scrubResponse(resp, tt.swaps)
			if resp.Status != "400 "+tt.want || resp.Header.Get("X-Echo") != tt.want {
				t.Fatalf("status %q, header field %q; want %q in each", resp.Status, resp.Header.Get("X-Echo"), tt.want)
			}
			checkEveryCut(t, tt.swaps, tt.body, tt.want)
		})
	}
}

// TestSwapThenScrubRoundTrips: what a bound host echoes of a request reaches the sandbox as the
// sandbox sent it. A value put in for its placeholder is never read again as part of another
// placeholder: the sandbox knows every placeholder, so one whose first (or last) character a
// value's last (or first) would complete was its to send, and the value swapped in for it
// then took the other's place upstream, the rest of the first value in clear beside it, where
// the echo showed it.
func TestSwapThenScrubRoundTrips(t *testing.T) {
	a := &secret{env: "A", value: "tokenAAAAAAAAq", placeholder: "tokenZZZZZZZZr"}
	b := &secret{env: "B", value: "keyBBBBBBBBB", placeholder: "qeyCCCCCCCCC"} // a's last byte begins it
	c := &secret{env: "C", value: "keyDDDDDDDd", placeholder: "qeyEEEEEEEt"}   // a's first byte ends it
	long := &secret{env: "L", value: "keyBBBBBBBBBBBBBBB", placeholder: "qeyCCCCCCCCCCCCCCC"}
	basic := func(pass string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte("user:"+pass)) }
	tests := []struct {
		name    string
		secrets []*secret
		sent    string
	}{
		{"a value's last byte and the sandbox's bytes make a placeholder", []*secret{a, b}, "Bearer " + a.placeholder + b.placeholder[1:]},
		{"the sandbox's bytes and a value's first byte make a placeholder", []*secret{a, c}, "Bearer " + c.placeholder[:len(c.placeholder)-1] + a.placeholder},
		{"the same inside Basic credentials", []*secret{a, b}, basic(a.placeholder + b.placeholder[1:])},
		{"the same with the other value the longer", []*secret{a, long}, "Bearer " + a.placeholder + long.placeholder[1:]},
		{"two placeholders side by side", []*secret{a, b}, a.placeholder + b.placeholder},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{"X-Token": {tt.sent}}
			sent := h.Clone()
			swapSecrets(h, tt.secrets)
			swaps := append(tunnelSwaps(tt.secrets), basicSwaps(sent, h)...)
			up := h.Get("X-Token")
			if up == tt.sent {
				t.Fatal("nothing was swapped: the test would prove nothing")
			}
			// The host echoes the field as it got it, and Basic credentials decoded.
			echo, want := up, tt.sent
			if _, cred, ok := strings.Cut(up, "Basic "); ok {
				dec, _ := base64.StdEncoding.DecodeString(cred)
				sentDec, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(tt.sent, "Basic "))
				echo, want = echo+" "+string(dec), want+" "+string(sentDec)
			}
			resp := &http.Response{Header: http.Header{"X-Echo": {echo}}, Body: io.NopCloser(strings.NewReader(echo))}
			scrubResponse(resp, swaps)
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.Header.Get("X-Echo"); got != want || string(body) != want {
				t.Fatalf("the sandbox sent %q and read back %q in a field, %q in the body", want, got, body)
			}
		})
	}
}

// TestScrubDropsFieldsNamedByAValue: a header field or trailer whose name holds a value (an
// echo that makes a field of what it got) is dropped. The Transport writes a name in its
// canonical case ("X-Abcdef0123-Tok"), so the value there matches in no case of its own and
// replacing it would miss it; the sandbox read it, letters' case aside.
func TestScrubDropsFieldsNamedByAValue(t *testing.T) {
	swaps := []swap{{real: []byte("tok-abcdef0123456789"), ph: []byte("qrs-zyxwvu9876543210")}}
	resp := &http.Response{
		Header:  http.Header{"X-Tok-Abcdef0123456789": {"1"}, "X-Echo": {"tok-abcdef0123456789"}},
		Trailer: http.Header{"Tok-Abcdef0123456789-Seen": {"1"}},
		Body:    http.NoBody,
	}
	scrubResponse(resp, swaps)
	if len(resp.Trailer) != 0 {
		t.Fatalf("the trailer %v is announced before the body", resp.Trailer)
	}
	resp.Trailer["Tok-Abcdef0123456789-Seen"] = []string{"1"} // as the Transport fills it at the body's end
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatal(err)
	}
	want := http.Header{"X-Echo": {"qrs-zyxwvu9876543210"}}
	if len(resp.Header) != 1 || resp.Header.Get("X-Echo") != want.Get("X-Echo") || len(resp.Trailer) != 0 {
		t.Fatalf("header %v, trailer %v; want %v and no trailer", resp.Header, resp.Trailer, want)
	}
}
