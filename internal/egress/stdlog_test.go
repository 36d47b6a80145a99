package egress

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	testharness "github.com/boxcar-run/boxcar/test/harness"
)

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

// TestStdLogQuotesNothing: the upstream side of a terminated tunnel is a net/http Transport,
// which writes the bytes a kept-alive connection receives while no request is outstanding to
// the standard logger, verbatim ("Unsolicited response received on idle HTTP channel starting
// with ..."). A bound host whose answer to HEAD carries a body quoting the swapped
// Authorization would put the real value in the worker's log, unscrubbed; the sandbox chooses
// the method, so it can make any such server do it. Once CaptureStdLog has run (the worker's
// wiring), the line says which file wrote it and quotes nothing.
func TestStdLogQuotesNothing(t *testing.T) {
	up, upCA := rawUpstream(t)
	h := setup(t, func(c *Config) {
		c.Dialer.(*stubDialer).routes[apiAddr+":443"] = up
		c.UpstreamCAPEM = upCA
	})
	var logged testharness.LogBuffer
	prev, prevFlags, prevPrefix := log.Writer(), log.Flags(), log.Prefix()
	t.Cleanup(func() { log.SetOutput(prev); log.SetFlags(prevFlags); log.SetPrefix(prevPrefix) })
	CaptureStdLog(slog.New(slog.NewJSONHandler(&logged, nil)))

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
	testharness.Wait(t, "a line saying net/http's Transport wrote to the standard logger", func() (bool, error) {
		out := logged.String()
		return strings.Contains(out, `"source":"transport.go:`), fmt.Errorf("logged so far:\n%s", redact(out))
	}, testharness.Within(10*time.Second))
	out := logged.String()
	if strings.Contains(out, realToken) || strings.Contains(out, "invalid token") {
		t.Fatalf("the upstream's bytes are in the worker's log:\n%s", redact(out))
	}
	// A line whose flags another caller changed names no file, and still quotes nothing.
	log.SetFlags(0)
	log.Printf("%s: %s", realToken, realToken)
	if out := logged.String(); strings.Contains(out, realToken) || !strings.Contains(out, `"source":"unknown"`) {
		t.Fatalf("the standard logger's lines:\n%s", redact(out))
	}
}
