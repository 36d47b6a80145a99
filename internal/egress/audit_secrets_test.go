package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
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
