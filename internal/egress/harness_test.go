package egress

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	testharness "github.com/boxcar-run/boxcar/test/harness"
)

// The tests' network: names resolve (stubResolver) to 198.18.0.0/15 addresses, which the
// stubDialer maps to httptest servers on 127.0.0.1. What the proxy dials is what it checked,
// and no packet leaves loopback.
const (
	realToken = "sk-live-REALvalue0123456789abcdefXYZ" // the secret's real value
	apiAddr   = "198.18.0.10"                          // api.example.com: the bound host
	pkgAddr   = "198.18.0.11"                          // pkg.example.com: allowed, no secret
	filesAddr = "198.18.0.12"                          // *.files.example.com
	plainAddr = "198.18.0.13"                          // plain.example.com
	hostAddr  = "198.18.0.99"                          // an address of "this host"
	natsAddr  = "198.18.0.20"                          // nats.files.example.com: the worker's NATS on 4222
	storeAddr = "198.18.0.21"                          // the worker's store on 9000, by address; mirror.files.example.com
)

// stubResolver answers from a table; a name with several answers gives them in turn (rebinding).
// It records each name as asked; "name." (fully qualified) finds the table's "name".
type stubResolver struct {
	mu    sync.Mutex
	names map[string][][]netip.Addr
	calls map[string]int
	asked []string
	// hang, when set, makes every lookup wait for its context's end, after a send on hang: a
	// lookup the job's end cuts short.
	hang chan<- struct{}
	// fail counts, by name, the look-ups still to fail as one that timed out does.
	fail map[string]int
	// block holds, by name, every lookup of that name until its channel closes or its
	// context ends: a slow answer.
	block map[string]chan struct{}
}

func (r *stubResolver) LookupNetIP(ctx context.Context, _, name string) ([]netip.Addr, error) {
	r.mu.Lock()
	r.asked = append(r.asked, name)
	if hang := r.hang; hang != nil {
		r.mu.Unlock()
		signal(hang)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if wait := r.block[strings.TrimSuffix(name, ".")]; wait != nil {
		r.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, &net.DNSError{Err: "i/o timeout", Name: name, IsTimeout: true, IsTemporary: true}
		}
		r.mu.Lock()
	}
	defer r.mu.Unlock()
	name = strings.TrimSuffix(name, ".")
	if r.fail[name] > 0 {
		r.fail[name]--
		return nil, &net.DNSError{Err: "i/o timeout", Name: name, IsTimeout: true, IsTemporary: true}
	}
	answers, ok := r.names[name]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
	}
	i := min(r.calls[name], len(answers)-1)
	r.calls[name]++
	return answers[i], nil
}

// stubDialer maps checked addresses to loopback servers, records every address asked for and
// counts the upstream connections the proxy holds open.
type stubDialer struct {
	mu     sync.Mutex
	routes map[string]string // "198.18.x.y:port" -> "127.0.0.1:port"
	dialed []string
	open   int
	// hang, when set, makes every dial wait for its context's end, after a send on hang: a
	// dial the job's end cuts short.
	hang chan<- struct{}
}

func (d *stubDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.dialed = append(d.dialed, addr)
	to, ok := d.routes[addr]
	hang := d.hang
	d.mu.Unlock()
	if hang != nil {
		signal(hang)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if !ok {
		return nil, fmt.Errorf("stub dialer: no route to %s", addr)
	}
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, to)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.open++
	d.mu.Unlock()
	return &countedConn{Conn: c, d: d}, nil
}

// openConns is how many upstream connections the proxy has not closed.
func (d *stubDialer) openConns() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.open
}

// countedConn takes itself off its dialer's count when the proxy closes it.
type countedConn struct {
	net.Conn
	d    *stubDialer
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.d.mu.Lock()
		c.d.open--
		c.d.mu.Unlock()
	})
	return c.Conn.Close()
}

// CloseWrite keeps the half-close a spliced tunnel relies on.
func (c *countedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

func (d *stubDialer) seen() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.dialed...)
}

// upstream records the requests a test server got whole, and counts those whose body ended
// short (a form the proxy cut).
type upstream struct {
	mu   sync.Mutex
	reqs []*http.Request
	cut  int
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/early" { // answers before the body is in, as a server refusing an upload
		u.mu.Lock()
		u.reqs = append(u.reqs, r)
		u.mu.Unlock()
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		return
	}
	if r.URL.Path == "/duplex" { // answers, then reads the body, as a server streaming its answer
		_ = http.NewResponseController(w).EnableFullDuplex()
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
	}
	body, err := io.ReadAll(r.Body)
	u.mu.Lock()
	if err != nil {
		u.cut++
		u.mu.Unlock()
		return
	}
	u.reqs = append(u.reqs, r)
	u.mu.Unlock()
	reflect(w, r)
	if r.URL.Path == "/body" {
		_, _ = w.Write(body)
		return
	}
	if r.URL.Path == "/bighead" { // a header past any sane limit, as a hostile server sends
		w.Header().Set("X-Big", strings.Repeat("a", 2<<20))
		return
	}
	if r.URL.Path == "/echo" {
		echo(w, r)
		return
	}
	if r.URL.Path == "/stream" {
		stream(w, r)
		return
	}
	fmt.Fprintf(w, "hello from %s, %d bytes in", r.Host, len(body))
}

// reflect answers with request fields many servers hand back: a request id, a CORS origin.
func reflect(w http.ResponseWriter, r *http.Request) {
	if id := r.Header.Get("X-Request-Id"); id != "" {
		w.Header().Set("X-Request-Id", id)
	}
	if o := r.Header.Get("Origin"); o != "" {
		w.Header().Set("Access-Control-Allow-Origin", o)
	}
}

// stream is a long download: ?n lines (streamLine), one every ?every, each flushed.
func stream(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.Atoi(r.URL.Query().Get("n"))
	every, _ := time.ParseDuration(r.URL.Query().Get("every"))
	for i := range n {
		if i > 0 {
			time.Sleep(every)
		}
		_, _ = io.WriteString(w, streamLine(i))
		w.(http.Flusher).Flush()
	}
}

func streamLine(i int) string { return fmt.Sprintf("line %03d\n", i) }

// echo writes the request's X-Echo field into the body, as an error message quoting its
// input would, gzipped when the client takes gzip, and into a trailer.
func echo(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Trailer", "X-Echo")
	var out io.Writer = w
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		defer zw.Close()
		out = zw
	}
	fmt.Fprintf(out, "bad value %q", r.Header.Get("X-Echo"))
	w.Header().Set("X-Echo", r.Header.Get("X-Echo"))
}

func (u *upstream) last(t *testing.T) *http.Request {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.reqs) == 0 {
		t.Fatal("the upstream got no request")
	}
	return u.reqs[len(u.reqs)-1]
}

func (u *upstream) all() []*http.Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*http.Request(nil), u.reqs...)
}

func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.reqs)
}

// cutCount is how many requests' bodies ended short.
func (u *upstream) cutCount() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.cut
}

// harness is one proxy with its upstreams, resolver, dialer and everything it reported.
type harness struct {
	proxy     *Proxy
	sock      string
	resolver  *stubResolver
	dialer    *stubDialer
	tlsUp     *upstream // api, pkg and files over TLS
	plainUp   *upstream // plain HTTP on every name
	upCA      *x509.CertPool
	upCAPEM   []byte
	reg       *prometheus.Registry
	logs      *testharness.LogBuffer // the proxy logs from its own goroutines
	stop      func() error           // ends Serve and returns its error
	mu        sync.Mutex
	decisions []Decision
}

func (h *harness) record(d Decision) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.decisions = append(h.decisions, d)
}

func (h *harness) all() []Decision {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Decision(nil), h.decisions...)
}

func testPolicy() Policy {
	return Policy{
		Allow: []string{"api.example.com", "pkg.example.com:443", "*.files.example.com", "plain.example.com:80", "127.0.0.1",
			// Exact entries for hosts of the worker's endpoints: the endpoints' own ports stay
			// refused, another port is lifted (TestWorkerEndpointHosts).
			"nats.files.example.com:4222", "nats.files.example.com:8222", storeAddr + ":9000", "mirror.files.example.com:8080"},
		Secrets: []Secret{
			{Env: "EXAMPLE_TOKEN", Value: realToken, Hosts: []string{"api.example.com"}},
		},
	}
}

// setup starts the upstreams and a proxy on a unix socket; tweak adjusts the config.
func setup(t testing.TB, tweak func(*Config)) *harness {
	t.Helper()
	return setupPolicy(t, tweak, testPolicy())
}

// setupPolicy is setup with a policy of the test's.
func setupPolicy(t testing.TB, tweak func(*Config), policy Policy) *harness {
	t.Helper()
	caPEM, ca, leaf := testUpstreamCert(t, "api.example.com", "pkg.example.com", "*.files.example.com")
	h := &harness{tlsUp: &upstream{}, plainUp: &upstream{}, upCA: ca, upCAPEM: caPEM, reg: prometheus.NewRegistry(), logs: &testharness.LogBuffer{}}
	tlsSrv := httptest.NewUnstartedServer(h.tlsUp)
	tlsSrv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	tlsSrv.StartTLS()
	t.Cleanup(tlsSrv.Close)
	plainSrv := httptest.NewServer(h.plainUp)
	t.Cleanup(plainSrv.Close)
	tlsHost, plainHost := tlsSrv.Listener.Addr().String(), plainSrv.Listener.Addr().String()
	h.dialer = &stubDialer{routes: map[string]string{}}
	for _, a := range []string{apiAddr, pkgAddr, filesAddr, plainAddr} {
		h.dialer.routes[a+":443"] = tlsHost
		h.dialer.routes[a+":80"] = plainHost
	}
	h.resolver = &stubResolver{names: testNames(), calls: map[string]int{}}
	cfg := Config{
		Resolver: h.resolver, Dialer: h.dialer, UpstreamCAPEM: caPEM,
		AllowedCIDRs:    []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")},
		WorkerEndpoints: []string{"nats.files.example.com:4222", storeAddr + ":9000"},
		HostAddrs:       []netip.Addr{netip.MustParseAddr(hostAddr)},
		Metrics:         NewMetrics(h.reg),
		Logger:          slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnDecision:      h.record,
		Limits:          Limits{HeaderTimeout: 2 * time.Second, MaxTunnels: 8},
	}
	if tweak != nil {
		tweak(&cfg)
	}
	p, err := New(cfg, policy)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.proxy = p
	h.sock = filepath.Join(t.TempDir(), "egress.sock")
	ln, err := net.Listen("unix", h.sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, ln) }()
	var once sync.Once
	var serveErr error
	h.stop = func() error {
		once.Do(func() { cancel(); serveErr = <-done })
		return serveErr
	}
	t.Cleanup(func() {
		if err := h.stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return h
}

func testNames() map[string][][]netip.Addr {
	one := func(s ...string) [][]netip.Addr {
		var as []netip.Addr
		for _, a := range s {
			as = append(as, netip.MustParseAddr(a))
		}
		return [][]netip.Addr{as}
	}
	n := map[string][][]netip.Addr{
		"api.example.com":          one(apiAddr),
		"pkg.example.com":          one(pkgAddr),
		"a.files.example.com":      one(filesAddr),
		"plain.example.com":        one(plainAddr),
		"other.example.com":        one(pkgAddr),
		"nats.files.example.com":   one(natsAddr),
		"mirror.files.example.com": one(storeAddr),
		"other.files.example.com":  one(storeAddr),
		"rebind.files.example.com": {
			{netip.MustParseAddr(filesAddr)}, {netip.MustParseAddr("127.0.0.1")},
		},
	}
	for name, addr := range deniedNames {
		n[name] = one(strings.Split(addr, ",")...)
	}
	return n
}

// deniedNames are allowed names (under *.files.example.com) that resolve to denied addresses.
var deniedNames = map[string]string{
	"lo.files.example.com":         "127.0.0.1",
	"lo8.files.example.com":        "127.8.9.10",
	"lo6.files.example.com":        "::1",
	"meta.files.example.com":       "169.254.169.254",
	"meta6.files.example.com":      "fd00:ec2::254",
	"wireserver.files.example.com": "168.63.129.16",
	"mapped.files.example.com":     "::ffff:127.0.0.1",
	"compat.files.example.com":     "::127.0.0.1",
	"translated.files.example.com": "::ffff:0:7f00:1",
	"nat64.files.example.com":      "64:ff9b::a9fe:a9fe",
	"sixtofour.files.example.com":  "2002:7f00:1::1",
	"teredo.files.example.com":     "2001:0:4136:e378:8000:63bf:80ff:fffe",
	"isatap.files.example.com":     "2600:1f00:1::5efe:7f00:1",
	"isatapu.files.example.com":    "2600:1f00:1:0:200:5efe:a9fe:a9fe",
	"isatapula.files.example.com":  "fd12::5efe:a00:1",
	"teredoc.files.example.com":    "2001:0:c612:1::80ff:fffe",
	"private.files.example.com":    "10.0.0.1",
	"private172.files.example.com": "172.16.5.4",
	"private192.files.example.com": "192.168.1.1",
	"cgnat.files.example.com":      "100.64.0.1",
	"doc.files.example.com":        "192.0.2.1",
	"mcast.files.example.com":      "224.0.0.1",
	"bcast.files.example.com":      "255.255.255.255",
	"zero.files.example.com":       "0.0.0.0",
	"ula.files.example.com":        "fc00::1",
	"ll6.files.example.com":        "fe80::1",
	"self.files.example.com":       hostAddr,
	"mixed.files.example.com":      filesAddr + ",127.0.0.1",
}

// testUpstreamCert makes a CA and a leaf for names, as the upstreams' own PKI.
func testUpstreamCert(t testing.TB, names ...string) ([]byte, *x509.CertPool, tls.Certificate) {
	t.Helper()
	var addrs []net.IP
	for _, n := range names {
		if a, err := netip.ParseAddr(n); err == nil {
			addrs = append(addrs, a.AsSlice()) // as caNames gives them: 4 bytes for IPv4
		}
	}
	a2, err := newAuthority(time.Hour, []string{"example.com"}, addrs)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := a2.leafFor(names)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(a2.pem)
	return a2.pem, pool, *leaf
}

// dialProxy opens a connection to the proxy's socket.
func (h *harness) dialProxy(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", h.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// raw sends payload on a new connection and returns the proxy's answer: its status and the
// reason in X-Boxcar-Egress.
func (h *harness) raw(t *testing.T, payload string) (int, Reason) {
	t.Helper()
	c := h.dialProxy(t)
	// A refusal can come before the proxy reads everything (the tunnel cap): the answer is
	// still there to read when the write fails.
	_, _ = io.WriteString(c, payload)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the proxy's answer: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode, Reason(resp.Header.Get("X-Boxcar-Egress"))
}

// client is an HTTP client that uses the proxy, trusting the upstreams' CA and the job CA.
func (h *harness) client(t testing.TB) *http.Client {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(h.upCAPEM)
	roots.AppendCertsFromPEM(h.proxy.CACertPEM())
	tr := &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy.invalid:3128"}),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", h.sock)
		},
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		DisableKeepAlives: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func (h *harness) placeholder(t testing.TB) string {
	t.Helper()
	return h.placeholderOf(t, "EXAMPLE_TOKEN")
}

// placeholderOf is the placeholder the sandbox sees for the secret in env.
func (h *harness) placeholderOf(t testing.TB, env string) string {
	t.Helper()
	for _, kv := range h.proxy.Env("127.0.0.1:3128", "") {
		if v, ok := strings.CutPrefix(kv, env+"="); ok {
			return v
		}
	}
	t.Fatalf("no placeholder for %s in Env", env)
	return ""
}

// answered reads the proxy's answer to a request written on br's connection (its status and
// the reason in X-Boxcar-Egress, as raw), then waits for the request's decision, the first
// matching cond.
func (h *harness) answered(t *testing.T, br *bufio.Reader, what string, cond func(Decision) bool) (int, Reason, Decision) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer to %s: %v", what, err)
	}
	resp.Body.Close()
	return resp.StatusCode, Reason(resp.Header.Get("X-Boxcar-Egress")), h.waitDecision(t, what, cond)
}

// withMethod matches the decisions of requests with method m.
func withMethod(m string) func(Decision) bool { return func(d Decision) bool { return d.Method == m } }

// notConnect matches the decisions of requests, not of the CONNECT of their tunnel.
func notConnect(d Decision) bool { return d.Method != http.MethodConnect }

// waitDecision waits for a decision matching cond: a spliced tunnel is decided when it ends,
// after the client has its response.
func (h *harness) waitDecision(t *testing.T, what string, cond func(Decision) bool) Decision {
	t.Helper()
	var found Decision
	testharness.Wait(t, "a decision: "+what, func() (bool, error) {
		all := h.all()
		for _, d := range all {
			if cond(d) {
				found = d
				return true, nil
			}
		}
		return false, fmt.Errorf("have %+v", all)
	}, testharness.Within(30*time.Second))
	return found
}

// signal sends on c if it has room: a stub's "reached", which no one may have to read.
func signal(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
