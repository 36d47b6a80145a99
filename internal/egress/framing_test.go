package egress

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
)

// TestChunkFramingCounted: a chunked upload inside a terminated tunnel is sent on by the
// Transport as chunks of its own, one for each read of the body, and the sandbox decides how
// much each read gets: a chunk at a time, a byte each, put 5 bytes of framing ("1\r\nX\r\n")
// upstream for every byte the job's cap counted. Every byte the upstream reads of the request
// is counted: the decision's bytes_out is at least what reached it.
func TestChunkFramingCounted(t *testing.T) {
	const chunks = 200
	caPEM, _, leaf := testUpstreamCert(t, "api.example.com")
	got := make(chan struct{})
	up := &countingListener{Listener: listenLoopback(t), cfg: &tls.Config{Certificates: []tls.Certificate{leaf}}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		one := make([]byte, 1)
		for {
			if _, err := io.ReadFull(r.Body, one); err != nil {
				break
			}
			got <- struct{}{}
		}
		_, _ = io.WriteString(w, "ok")
	})}
	go func() { _ = srv.Serve(up) }()
	t.Cleanup(func() { srv.Close() })

	h := setup(t, func(c *Config) { c.UpstreamCAPEM = caPEM })
	h.dialer.mu.Lock()
	h.dialer.routes[apiAddr+":443"] = up.Addr().String()
	h.dialer.mu.Unlock()
	tc, br := h.terminated(t, "api.example.com:443")
	if _, err := io.WriteString(tc, "POST /up HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	for range chunks {
		// Each chunk once the upstream has the one before: the proxy reads it alone.
		if _, err := io.WriteString(tc, "1\r\nX\r\n"); err != nil {
			t.Fatal(err)
		}
		<-got
	}
	if _, err := io.WriteString(tc, "0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	d := h.waitDecision(t, "the upload", func(d Decision) bool { return d.Method == http.MethodPost })
	if read := up.read.Load(); d.BytesOut < read {
		t.Errorf("the decision counts %d bytes out; the upstream read %d of the request (%d of them its body)", d.BytesOut, read, chunks)
	}
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// countingListener terminates TLS itself and counts the plain bytes read on its connections:
// what the proxy's Transport wrote.
type countingListener struct {
	net.Listener
	cfg  *tls.Config
	read atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: tls.Server(c, l.cfg), n: &l.read}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.n.Add(int64(n))
	return n, err
}
