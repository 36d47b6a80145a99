package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a bytes.Buffer the log package and the test may use at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// rawUpstream is a TLS server for api.example.com that answers every request with a 401
// quoting the Authorization it got, body and all, even to HEAD: a hand-rolled server (or a
// framework that does not drop HEAD bodies) as many are.
func rawUpstream(t *testing.T) (addr string, caPEM []byte) {
	t.Helper()
	caPEM, _, leaf := testUpstreamCert(t, "api.example.com")
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{leaf}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					body := "invalid token: " + req.Header.Get("Authorization") + "\n"
					fmt.Fprintf(c, "HTTP/1.1 401 Unauthorized\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
				}
			})
		}
	})
	return ln.Addr().String(), caPEM
}

// TestAuditSecretsUnsolicitedBytesLogged: the upstream side of a terminated tunnel is a
// net/http Transport, which writes bytes a kept-alive connection receives while no request is
// outstanding to the standard logger, verbatim ("Unsolicited response received on idle HTTP
// channel starting with ..."). A bound host whose answer to HEAD carries a body quoting the
// swapped Authorization puts the real value in the worker's log (stderr), unscrubbed. The
// sandbox chooses the method, so it can make any such server do it.
func TestAuditSecretsUnsolicitedBytesLogged(t *testing.T) {
	up, upCA := rawUpstream(t)
	h := setup(t, func(c *Config) {
		c.Dialer.(*stubDialer).routes[apiAddr+":443"] = up
		c.UpstreamCAPEM = upCA
	})
	var logged lockedBuffer
	prev, prevFlags := log.Writer(), log.Flags()
	log.SetOutput(&logged)
	t.Cleanup(func() { log.SetOutput(prev); log.SetFlags(prevFlags) })

	ph := h.placeholder(t)
	req, _ := http.NewRequest(http.MethodHead, "https://api.example.com/v1/items", nil)
	req.Header.Set("Authorization", "Bearer "+ph)
	resp, err := h.client(t).Do(req)
	if err != nil {
		t.Fatalf("HEAD through the proxy: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("status %d, want the upstream's 401", resp.StatusCode)
	}
	if got := h.waitDecision(t, "the HEAD inside the tunnel", func(d Decision) bool { return d.Method == http.MethodHead }); len(got.Secrets) != 1 {
		t.Fatalf("decision %+v: the placeholder was not swapped", got)
	}
	// The Transport's read loop logs the moment it finds the idle connection's bytes.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logged.String(), "Unsolicited") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if out := logged.String(); strings.Contains(out, realToken) {
		t.Fatalf("the real value is in the worker's log:\n%s", redact(out))
	}
}

// oracleUpstream is api.example.com with a streaming endpoint that writes back what the
// request asks for, a line at a time, flushing each and pausing between them: a log tail, an
// echo or progress stream of a job the caller named. /oracle?k=K&c=CANDIDATES writes "\n"+K+c
// for each c.
func oracleUpstream(t *testing.T) (addr string, caPEM []byte) {
	t.Helper()
	caPEM, _, leaf := testUpstreamCert(t, "api.example.com")
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		k, cands := r.URL.Query().Get("k"), r.URL.Query().Get("c")
		for _, c := range cands {
			if _, err := io.WriteString(w, "\n"+k+string(c)); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(40 * time.Millisecond):
			}
		}
		_, _ = io.WriteString(w, "\n")
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String(), caPEM
}

// TestAuditSecretsScrubberIsAnOracle: the answer of a bound host is scrubbed as it streams,
// and scrubBody holds back exactly the tail that is a proper prefix of the real value until
// more comes (heldTail). Where the bound host streams back bytes the sandbox chose, the
// sandbox sees which of its guesses were held: the one that is the value's next character. It
// recovers the value one character at a time, each from at most 26 guesses (the placeholder
// gives each position's class). The test recovers the first 12 characters.
func TestAuditSecretsScrubberIsAnOracle(t *testing.T) {
	up, upCA := oracleUpstream(t)
	h := setup(t, func(c *Config) {
		c.Dialer.(*stubDialer).routes[apiAddr+":443"] = up
		c.UpstreamCAPEM = upCA
		c.Limits.MaxTunnels = 64
	})
	ph := h.placeholder(t) // all the sandbox knows of the value: its shape
	client := h.client(t)
	const want = 12
	known := ""
	for len(known) < want {
		cands := classOf(rune(ph[len(known)]))
		if cands == "" { // punctuation: the placeholder keeps it
			known += ph[len(known) : len(known)+1]
			continue
		}
		next, ok := guessNext(t, client, known, cands)
		if !ok {
			break
		}
		known += next
	}
	t.Logf("the sandbox learned %q of a %d-byte value", redact(known), len(realToken))
	if len(known) >= want && strings.HasPrefix(realToken, known) {
		t.Fatalf("the sandbox recovered the value's first %d characters through the scrubber's held tail", len(known))
	}
}

// guessNext asks the oracle endpoint to stream known+c for each candidate and returns the c
// whose line came late, glued to the line after it: the one the proxy held back.
func guessNext(t *testing.T, client *http.Client, known, cands string) (string, bool) {
	t.Helper()
	u := "https://api.example.com/oracle?" + url.Values{"k": {known}, "c": {cands}}.Encode()
	resp, err := client.Get(u)
	if err != nil {
		t.Fatalf("GET the stream: %v", err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 && buf[0] != '\n' {
			held, _, _ := strings.Cut(string(buf[:n]), "\n")
			if len(held) == len(known)+1 && strings.HasPrefix(held, known) {
				return held[len(known):], true
			}
		}
		if err != nil {
			return "", false
		}
	}
}

// TestAuditSecretsNarrowDropsSecretPort: a profile binds a secret to "*.example.com:443"
// (the API on 443; whatever else listens on the hosts' other ports must never see it) and
// allows "*.example.com". A job's network.allow of "api.example.com", which narrows the
// profile's, turns the binding into "api.example.com" on any port (narrowHosts keeps the
// job's name and neither rule's port), so the job's sandbox gets the real value sent to
// api.example.com:8443, where the profile splices the tunnel and sends nothing.
func TestAuditSecretsNarrowDropsSecretPort(t *testing.T) {
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
