package egress

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	testharness "github.com/boxcar-run/boxcar/test/harness"
)

// TestRebinding: a name that resolves to an allowed address, then to loopback, is resolved
// once per request, and the address checked is the one dialled.
func TestRebinding(t *testing.T) {
	h := setup(t, nil)
	if status, _ := get(t, h, "https://rebind.files.example.com/", "x"); status != http.StatusOK {
		t.Fatalf("first request: %d", status)
	}
	h.waitDecision(t, "the first tunnel", func(d Decision) bool { return d.Allowed && d.Addr == filesAddr+":443" })
	if h.resolver.calls["rebind.files.example.com"] != 1 {
		t.Fatalf("resolved %d times for one request", h.resolver.calls["rebind.files.example.com"])
	}
	req, _ := http.NewRequest(http.MethodGet, "https://rebind.files.example.com/", nil)
	if resp, err := h.client(t).Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("the rebound name went through")
	}
	d := h.waitDecision(t, "the refusal", func(d Decision) bool { return !d.Allowed })
	if d.Reason != ReasonDeniedAddress {
		t.Fatalf("decision %+v", d)
	}
	if got := h.dialer.seen(); !slices.Equal(got, []string{filesAddr + ":443"}) {
		t.Fatalf("dialled %v, want only the checked %s:443", got, filesAddr)
	}
}

// TestResolvesTheNameDecided: the proxy asks for the name it checked, fully qualified. A
// relative name goes through the resolver's search list (ndots:5 in a pod tries it under every
// search domain first, and every name that does not exist falls through to them), so
// "x.example.com" could come back as the address of "x.example.com.corp.internal". The name
// a secret is bound to is asked for too, once, when the job has not asked for it (held.go).
func TestResolvesTheNameDecided(t *testing.T) {
	tests := []struct {
		url  string
		want []string
	}{
		{"https://a.files.example.com/", []string{"a.files.example.com.", "api.example.com."}},
		{"https://A.Files.Example.COM./", []string{"a.files.example.com.", "api.example.com."}},
		{"http://plain.example.com/", []string{"plain.example.com.", "api.example.com."}},
		{"https://api.example.com/", []string{"api.example.com."}},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			h := setup(t, nil)
			h.resolver.mu.Lock()
			h.resolver.asked = nil // New's own look-ups of the worker's endpoints
			h.resolver.mu.Unlock()
			if status, _ := get(t, h, tt.url, "x"); status != http.StatusOK {
				t.Fatalf("status %d", status)
			}
			h.resolver.mu.Lock()
			defer h.resolver.mu.Unlock()
			if !slices.Equal(h.resolver.asked, tt.want) {
				t.Fatalf("the resolver was asked %q, want only %q", h.resolver.asked, tt.want)
			}
		})
	}
}

func TestCaps(t *testing.T) {
	tests := []struct {
		name  string
		tweak func(*Config)
		want  Reason
	}{
		{"request cap", func(c *Config) { c.Limits.MaxRequests = 1 }, ReasonRequestCap},
		{"byte cap", func(c *Config) { c.Limits.MaxBytes = 300 }, ReasonByteCap},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := setup(t, tt.tweak)
			for range 3 {
				req, _ := http.NewRequest(http.MethodGet, "http://plain.example.com/", nil)
				if resp, err := h.client(t).Do(req); err == nil {
					resp.Body.Close()
				}
			}
			if d := h.waitDecision(t, "a refusal", func(d Decision) bool { return !d.Allowed }); d.Reason != tt.want {
				t.Fatalf("decision %+v, want %s", d, tt.want)
			}
		})
	}
}

// TestByteCapAdmission: a job at its byte cap gets no new forwarded request, tunnel or request
// inside an open terminated tunnel: each is refused with byte_cap before anything is dialled
// or sent. The meters alone cut a transfer only once it had written a buffer's worth, so every
// request after the cap still reached its upstream.
func TestByteCapAdmission(t *testing.T) {
	tests := []struct {
		name string
		send func(t *testing.T, h *harness, open *tlsConn) int // the status the client reads
	}{
		{"forwarded request", func(t *testing.T, h *harness, _ *tlsConn) int {
			status, _ := h.raw(t, getReq("http://plain.example.com/", "plain.example.com"))
			return status
		}},
		{"CONNECT to a spliced host", func(t *testing.T, h *harness, _ *tlsConn) int {
			status, _ := h.raw(t, connectReq("pkg.example.com:443"))
			return status
		}},
		{"CONNECT to the bound host", func(t *testing.T, h *harness, _ *tlsConn) int {
			status, _ := h.raw(t, connectReq("api.example.com:443"))
			return status
		}},
		{"request in a terminated tunnel opened before the cap", func(t *testing.T, h *harness, open *tlsConn) int {
			if _, err := io.WriteString(open.c, getReq("/", "api.example.com")); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(open.br, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := setup(t, func(c *Config) { c.Limits.MaxBytes = 2000 })
			var open tlsConn
			open.c, open.br = h.terminated(t, "api.example.com:443")
			h.proxy.bytes.Store(h.proxy.dataCap()) // the job is at its cap, the answer that says so kept back
			if status := tt.send(t, h, &open); status != http.StatusTooManyRequests {
				t.Fatalf("status %d, want 429", status)
			}
			d := h.waitDecision(t, "the refusal", func(d Decision) bool { return !d.Allowed })
			if d.Reason != ReasonByteCap {
				t.Errorf("decision %+v, want byte_cap", d)
			}
			if got := h.dialer.seen(); len(got) != 0 {
				t.Errorf("the proxy dialled %v at the byte cap", got)
			}
			if n := h.tlsUp.count() + h.plainUp.count(); n != 0 {
				t.Errorf("the upstreams got %d requests at the byte cap", n)
			}
		})
	}
}

// tlsConn is a terminated tunnel as the sandbox holds it.
type tlsConn struct {
	c  *tls.Conn
	br *bufio.Reader
}

// TestByteCapNeverExceeded: requests that each carry 1500 bytes in a header field move no more
// than the job's byte cap on any path, and no more than the cap reaches the upstreams: a write
// is cut to what is left (forwarded, spliced) and a terminated tunnel's header, which the
// Transport writes whole, goes only when it fits. The meters counted a write once it was
// through, so every request after the cap still went whole (a 2000-byte cap moved 9,698).
func TestByteCapNeverExceeded(t *testing.T) {
	exfil := strings.Repeat("A", 1500)
	tests := []struct {
		name  string
		extra int64 // the cap above 2000: a spliced tunnel's TLS handshakes are counted too
		send  func(t *testing.T, h *harness, i int)
	}{
		{"forwarded", 0, func(t *testing.T, h *harness, i int) {
			// Past the cap's one answer the proxy closes the connection without a word.
			c := h.dialProxy(t)
			sendRaw(getReq(fmt.Sprintf("http://plain.example.com/%d", i), "plain.example.com", "X-Exfil: "+exfil+"\r\n", "Connection: close\r\n"))(t, c)
			_, _ = io.ReadAll(c)
			c.Close()
		}},
		{"spliced", 8 << 10, func(t *testing.T, h *harness, i int) {
			try(t, h, fmt.Sprintf("https://pkg.example.com/%d", i), exfil)
		}},
		{"terminated", 0, func(t *testing.T, h *harness, i int) {
			try(t, h, fmt.Sprintf("https://api.example.com/%d", i), exfil)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := setup(t, func(c *Config) { c.Limits.MaxBytes = 2000 + tt.extra })
			for i := range 6 {
				tt.send(t, h, i)
			}
			h.waitDecision(t, "the byte cap", func(d Decision) bool { return d.Reason == ReasonByteCap })
			testharness.Wait(t, "every tunnel to end", func() (bool, error) { return h.proxy.tunnels.Load() == 0, nil })
			limit := h.proxy.cfg.Limits.MaxBytes
			if used := h.proxy.bytes.Load(); used > limit {
				t.Errorf("the job moved %d bytes, cap %d", used, limit)
			}
			if s := h.proxy.Summary(); s.BytesOut+s.BytesIn > limit {
				t.Errorf("summary: %d bytes out, %d in; cap %d", s.BytesOut, s.BytesIn, limit)
			}
			got := 0
			for _, r := range append(h.tlsUp.all(), h.plainUp.all()...) {
				got += len(r.Header.Get("X-Exfil"))
			}
			if int64(got) > limit {
				t.Errorf("the upstreams got %d bytes of X-Exfil, cap %d", got, limit)
			}
		})
	}
}

// try makes a GET through the proxy with field as X-Exfil; a refusal is no failure.
func try(t *testing.T, h *harness, url, field string) {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("X-Exfil", field)
	if resp, err := h.client(t).Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// TestSummaryAndMetrics: the summary counts every decision, and a host's requests there are
// the requests that sent it a byte (docs/egress.md): the CONNECT that opens a terminated tunnel
// sends the host nothing, and a tunnel with one request in it showed its host 2 requests.
func TestSummaryAndMetrics(t *testing.T) {
	h := setup(t, nil)
	ph := h.placeholder(t)
	get(t, h, "https://api.example.com/a", ph)
	get(t, h, "http://plain.example.com/b", ph)
	h.raw(t, connectReq("lo.files.example.com:443"))
	h.waitDecision(t, "three", func(Decision) bool { return len(h.all()) >= 4 })
	s := h.proxy.Summary()
	if s.Denied != 1 || s.Requests != 4 || len(s.Hosts) != 2 || s.Hosts[0].Host != "api.example.com" || s.Hosts[0].Requests != 1 ||
		s.Hosts[1].Host != "plain.example.com" || s.Hosts[1].BytesIn == 0 || !slices.Equal(s.Secrets, []string{"EXAMPLE_TOKEN"}) {
		t.Fatalf("summary %+v", s)
	}
	got := h.waitDecision(t, "the GET in the tunnel", func(d Decision) bool { return d.Host == "api.example.com" && d.Method == http.MethodGet })
	if s.Hosts[0].BytesOut != got.BytesOut || s.Hosts[0].BytesIn != got.BytesIn {
		t.Fatalf("api.example.com's summary %+v, want its one request's bytes, %d out and %d in", s.Hosts[0], got.BytesOut, got.BytesIn)
	}
	if n := testutil.ToFloat64(h.proxy.cfg.Metrics.Decisions.WithLabelValues("denied", string(ReasonDeniedAddress))); n != 1 {
		t.Fatalf("denied decisions %v", n)
	}
	if text := gatherText(t, h); strings.Contains(text, "files.example.com") || strings.Contains(text, "api.example.com") {
		t.Fatal("a host name is in the metrics")
	}
}

func TestParseHost(t *testing.T) {
	tests := []struct{ in, want string }{
		{"Example.COM.", "example.com"},
		{"127.0.0.1", "127.0.0.1"},
		{"2130706433", "127.0.0.1"},
		{"0177.0.0.01", "127.0.0.1"},
		{"0x7F.1", "127.0.0.1"},
		{"0x7f000001", "127.0.0.1"},
		{"127.1", "127.0.0.1"},
		{"127.0.1", "127.0.0.1"},
		{"0", "0.0.0.0"},
		{"[::ffff:7f00:1]", "127.0.0.1"},
		{"[::FFFF:127.0.0.1]", "127.0.0.1"},
		{"[0::1]", "::1"},
		{"::1", "::1"},
		{"a_b.example.com", "a_b.example.com"},
		{"1.2.3.0x", "1.2.3.0"}, // WHATWG reads a bare 0x as 0
	}
	for _, tt := range tests {
		h, err := parseHost(tt.in)
		if err != nil || h.String() != tt.want {
			t.Errorf("parseHost(%q) = %q, %v; want %q", tt.in, h.String(), err, tt.want)
		}
	}
	for _, bad := range []string{"", "256.0.0.1", "1.2.3.4.5", "example.123", "[fe80::1%eth0]", "a b.com", "ex%61mple.com", "-a.com", "xn--.com\x00", "09.1.1.1", "[::1"} {
		if h, err := parseHost(bad); err == nil {
			t.Errorf("parseHost(%q) = %q, want an error", bad, h.String())
		}
	}
}

func TestAddrFilter(t *testing.T) {
	f, err := newAddrFilter(Config{
		// Besides the tests' range: what an operator lifts for an internal mirror, a CGNAT pod
		// network or a cloud's internal IPv6 (GCP hands out fd20::/20).
		AllowedCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("64:ff9b::/96"),
			netip.MustParsePrefix("::ffff:0:0:0/96"), netip.MustParsePrefix("64:ff9b:1::/48"), netip.MustParsePrefix("100.64.0.0/10"), netip.MustParsePrefix("fd00::/8"),
			netip.MustParsePrefix("2002::/16"), netip.MustParsePrefix("2001::/32"), netip.MustParsePrefix("::ffff:10.20.0.0/112")},
		// IPv4 prefixes written IPv4-mapped, as an address is read (::ffff:a.b.c.d is a.b.c.d).
		DeniedCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16"), netip.MustParsePrefix("::ffff:8.8.4.0/120")},
		// A DNS64 of the network's own answering in global space, and a local /64 one.
		NAT64Prefixes: []netip.Prefix{netip.MustParsePrefix("2600:1f00:64::/96"), netip.MustParsePrefix("64:ff9b:1:ab::/64")},
		Resolver:      &stubResolver{}, Limits: Limits{DialTimeout: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		addr string
		ok   bool
	}{
		{"198.18.0.1", true},       // lifted by AllowedCIDRs
		{"198.19.0.1", false},      // DeniedCIDRs win
		{"127.0.0.1", false},       // loopback is never lifted
		{"169.254.169.254", false}, // metadata
		{"fd00:ec2::254", false},   // metadata, IPv6
		{"10.1.2.3", false},        // private, not lifted
		{"100.100.100.100", true},  // CGNAT, lifted
		{"100.100.100.200", false}, // Alibaba Cloud metadata, inside lifted CGNAT
		{"fd20:ce::254", false},    // GCP metadata (IPv6), inside lifted fd00::/8
		{"fd00:ec2::254", false},   // AWS metadata (IPv6), inside lifted fd00::/8
		{"168.63.129.16", false},   // Azure WireServer, a public address
		{"::ffff:168.63.129.16", false},
		{"fd12::1", true},             // unique local, lifted
		{"203.0.113.9", false},        // documentation
		{"240.0.0.1", false},          // reserved
		{"64:ff9b::c612:1", true},     // NAT64 lifted, embeds 198.18.0.1
		{"64:ff9b::7f00:1", false},    // NAT64 lifted, but embeds loopback
		{"64:ff9b::a9fe:a9fe", false}, // embeds metadata
		{"2002:c612:1::", true},       // 6to4 lifted, embeds 198.18.0.1
		{"2002:7f00:1::", false},      // 6to4 lifted, but embeds loopback
		{"2002:a00:1::", false},       // 6to4 lifted, but embeds a private address
		{"::ffff:169.254.169.254", false},
		{"::ffff:0:a9fe:a9fe", false},               // IPv4-translated (SIIT) lifted, but embeds metadata
		{"::ffff:0:a00:1", false},                   // IPv4-translated lifted, but embeds a private address
		{"::ffff:0:c612:1", true},                   // IPv4-translated lifted, embeds 198.18.0.1
		{"2001:0:c612:1::", false},                  // Teredo lifted, but its client is 255.255.255.255 (the last 32 bits, inverted)
		{"2001:0:c612:1::39ed:fffe", true},          // Teredo lifted: server and client 198.18.0.1
		{"2001:0:c612:1::80ff:fffe", false},         // Teredo lifted, but the client is 127.0.0.1
		{"2001:0:a9fe:a9fe::39ed:fffe", false},      // Teredo lifted, but the server is metadata
		{"2001:2::1", false},                        // benchmarking (2001::/23 outside the lifted Teredo /32)
		{"::808:808", false},                        // IPv4-compatible, not lifted
		{"64:ff9b:1::808:808", true},                // local NAT64 lifted, embeds 8.8.8.8
		{"64:ff9b:1::a9fe:a9fe", false},             // local NAT64 lifted, but embeds metadata
		{"::ffff:808:808", true},                    // IPv4-mapped: 8.8.8.8 itself
		{"::ffff:7f00:1", false},                    // IPv4-mapped: loopback itself
		{"ff0e::5efe:808:808", false},               // multicast, whatever it carries
		{"fe80::5efe:808:808", false},               // link-local, whatever it carries
		{"2600:1f00:1::5efe:808:808", true},         // ISATAP (RFC 5214) in global space, embeds 8.8.8.8
		{"2600:1f00:1::5efe:7f00:1", false},         // ISATAP, embeds loopback
		{"2600:1f00:1:0:200:5efe:a9fe:a9fe", false}, // ISATAP with the u bit, embeds metadata
		{"2600:1f00:1:0:100:5efe:a00:1", false},     // ISATAP with the g bit, embeds a private address
		{"2600:1f00:1:0:300:5efe:a00:1", false},     // ISATAP with both bits
		{"2600:1f00:1:0:200:5efe:c612:1", true},     // ISATAP, embeds the lifted 198.18.0.1
		{"2600:1f00:1:0:400:5efe:7f00:1", true},     // not ISATAP: other bits than u and g are set
		{"fd12::5efe:7f00:1", false},                // ISATAP in lifted unique-local space, embeds loopback
		{"fd12::200:5efe:a9fe:a9fe", false},         // the same with the u bit, metadata
		{"2002:808:808::5efe:7f00:1", false},        // 6to4 lifted, public, but its ISATAP id embeds loopback
		{"64:ff9b::5efe:808:808", true},             // the well-known NAT64 prefix reads the last 32 bits only
		{"2600:1f00:64::5efe:a9fe:a9fe", false},     // outside the network's /96 NAT64 prefix; ISATAP, metadata
		{"::a9fe:a9fe", false},                      // IPv4-compatible, embeds metadata
		{"2600:1f00:64::a9fe:a9fe", false},          // the network's NAT64 prefix, embeds metadata
		{"2600:1f00:64::a00:1", false},              // the network's NAT64 prefix, embeds a private address
		{"2600:1f00:64::808:808", true},             // the network's NAT64 prefix, embeds 8.8.8.8
		{"64:ff9b:1:ab:a:0:808:808", false},         // a local /64 NAT64 prefix: 10.0.0.8 after the u octet (8.8.8.8 as a /96)
		{"64:ff9b:1:ab:8:808:800:0", true},          // a local /64 NAT64 prefix: 8.8.8.8
		{"8.8.8.8", true},
		{"8.8.4.4", false},          // denied as ::ffff:8.8.4.0/120
		{"::ffff:8.8.4.4", false},   // the same, mapped
		{"64:ff9b::808:404", false}, // NAT64 lifted, but embeds the denied 8.8.4.4
		{"10.20.1.1", true},         // lifted as ::ffff:10.20.0.0/112
		{"10.21.1.1", false},        // outside it
		{"2606:4700::1111", true},
	}
	for _, tt := range tests {
		r, _ := f.check(netip.MustParseAddr(tt.addr), 443, false, tt.addr)
		if (r == "") != tt.ok {
			t.Errorf("check(%s) = %q, want ok=%v", tt.addr, r, tt.ok)
		}
	}
}

func TestPolicyErrors(t *testing.T) {
	good := Secret{Env: "T", Value: realToken, Hosts: []string{"a.example.com"}}
	tests := []struct {
		name   string
		policy Policy
	}{
		{"empty entry", Policy{Allow: []string{""}}},
		{"bad port", Policy{Allow: []string{"a.example.com:0"}}},
		{"port out of range", Policy{Allow: []string{"a.example.com:70000"}}},
		{"bare wildcard", Policy{Allow: []string{"*.com"}}},
		{"wildcard address", Policy{Allow: []string{"*.1.2.3.4"}}},
		{"bad name", Policy{Allow: []string{"a/b"}}},
		{"secret host not allowed", Policy{Allow: []string{"a.example.com"}, Secrets: []Secret{{Env: "T", Value: realToken, Hosts: []string{"b.example.com"}}}}},
		{"secret with no host", Policy{Allow: []string{"a.example.com"}, Secrets: []Secret{{Env: "T", Value: realToken}}}},
		{"secret env not a name", Policy{Allow: []string{"a.example.com"}, Secrets: []Secret{{Env: "1T", Value: realToken, Hosts: []string{"a.example.com"}}}}},
		{"secret too short", Policy{Allow: []string{"a.example.com"}, Secrets: []Secret{{Env: "T", Value: "abc", Hosts: []string{"a.example.com"}}}}},
		{"secret with a line break", Policy{Allow: []string{"a.example.com"}, Secrets: []Secret{{Env: "T", Value: realToken + "\nx", Hosts: []string{"a.example.com"}}}}},
		{"secret env twice", Policy{Allow: []string{"a.example.com"}, Secrets: []Secret{good, good}}},
		{"secret host is the wildcard's apex", Policy{Allow: []string{"*.example.com"}, Secrets: []Secret{{Env: "T", Value: realToken, Hosts: []string{"example.com"}}}}},
	}
	// The value as read is at fault in these, not the profile: ErrSecretValue.
	valueFaults := map[string]bool{"secret too short": true, "secret with a line break": true}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(Config{Resolver: &stubResolver{}}, tt.policy)
			if !errors.Is(err, ErrInvalidPolicy) || errors.Is(err, ErrSecretValue) != valueFaults[tt.name] {
				t.Fatalf("New: %v, want ErrInvalidPolicy (and ErrSecretValue: %v)", err, valueFaults[tt.name])
			}
			if strings.Contains(err.Error(), realToken) {
				t.Fatal("the error holds the value")
			}
			if cerr := Check(Config{}, tt.policy); cerr == nil || cerr.Error() != err.Error() {
				t.Fatalf("Check: %v, want New's error %v", cerr, err)
			}
		})
	}
}

// TestCheckConfig: Check refuses the config New would refuse, resolving nothing.
func TestCheckConfig(t *testing.T) {
	for name, cfg := range map[string]Config{
		"upstream CA without a certificate":  {UpstreamCAPEM: []byte("not a certificate\n")},
		"negative limit":                     {Limits: Limits{MaxTunnels: -1}},
		"NAT64 prefix of no RFC 6052 length": {NAT64Prefixes: []netip.Prefix{netip.MustParsePrefix("2600:1f00:64::/80")}},
		"NAT64 prefix that is IPv4":          {NAT64Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
	} {
		if err := Check(cfg, Policy{}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: Check: %v, want ErrInvalidConfig", name, err)
		}
		if _, err := New(cfg, Policy{}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: New: %v, want ErrInvalidConfig", name, err)
		}
	}
}

func TestPolicyAccepts(t *testing.T) {
	for _, p := range []Policy{
		{Allow: []string{"a.example.com:443"}, Secrets: []Secret{{Env: "T", Value: realToken, Hosts: []string{"a.example.com"}}}},
		{Allow: []string{"*.example.com"}, Secrets: []Secret{{Env: "T", Value: realToken, Hosts: []string{"a.b.example.com", "*.c.example.com"}}}},
		{Allow: []string{"198.18.0.1", "[2001:db8::1]:443", "::1"}},
	} {
		if _, err := New(Config{Resolver: &stubResolver{}}, p); err != nil {
			t.Errorf("New(%+v): %v", p.Allow, err)
		}
	}
}

// TestCAConstraints: the job CA vouches only for the hosts the job's list allows, and for
// none when the job holds no secret. A tunnel to any allowed host is terminated when the host
// is at an address a secret-bound host has (TestStoredEchoIsScrubbedUnderEveryName), so the
// CA signs for those too, where it was constrained to the secret-bound hosts.
func TestCAConstraints(t *testing.T) {
	h := setup(t, nil)
	ca := caOf(t, h.proxy)
	for name, ok := range map[string]bool{"api.example.com": true, "pkg.example.com": true, "a.files.example.com": true, "evil.test": false, "example.com": false, "127.0.0.1": true, "198.51.100.7": false} {
		if err := verifiesFor(h.proxy, ca, name); (err == nil) != ok {
			t.Errorf("leaf for %s verifies: %v, want %v", name, err, ok)
		}
	}
	p, err := New(Config{Resolver: &stubResolver{}}, Policy{Allow: []string{"api.example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := verifiesFor(p, caOf(t, p), "api.example.com"); err == nil {
		t.Error("the CA of a job with no secret vouches for an allowed host")
	}
	// A job whose list names no address: the CA vouches for none (no IP range permitted would
	// permit them all).
	p, err = New(Config{Resolver: &stubResolver{}}, Policy{Allow: []string{"api.example.com"},
		Secrets: []Secret{{Env: "EXAMPLE_TOKEN", Value: realToken, Hosts: []string{"api.example.com"}}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"198.51.100.7", "2001:db8::7"} {
		if err := verifiesFor(p, caOf(t, p), name); err == nil {
			t.Errorf("the CA of a job whose list names no address vouches for %s", name)
		}
	}
	if ca.PublicKeyAlgorithm != x509.ECDSA || ca.NotAfter.Sub(ca.NotBefore) > 25*60*60*1e9 {
		t.Errorf("CA: %v, valid %v", ca.PublicKeyAlgorithm, ca.NotAfter.Sub(ca.NotBefore))
	}
}

// caOf is the job CA's certificate.
func caOf(t *testing.T, p *Proxy) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(p.CACertPEM())
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// verifiesFor is whether a leaf the CA signs for name verifies for it.
func verifiesFor(p *Proxy, ca *x509.Certificate, name string) error {
	leaf, err := p.ca.leaf(name)
	if err != nil {
		return err
	}
	cert, _ := x509.ParseCertificate(leaf.Certificate[0])
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	_, err = cert.Verify(x509.VerifyOptions{DNSName: name, Roots: roots})
	return err
}

// TestOwnWritesCounted: what the proxy says itself (a refusal, a 100 Continue, a CONNECT's
// 200) is taken from the job's byte cap like the bytes it carries: each decision's bytes_in is
// every byte the sandbox read on its connection, and a job that draws refusal after refusal
// stops at max_bytes: the first request past the cap is answered byte_cap, in room kept for
// it, and the next is closed with no answer. Those writes went uncounted, so a sandbox could
// have the proxy answer it for ever.
func TestOwnWritesCounted(t *testing.T) {
	const limit = 2000
	tests := []struct {
		name string
		send func(t *testing.T, c net.Conn)
	}{
		{"not allowed", sendRaw(connectReq("evil.example.net:443"))},
		{"unparseable", sendRaw("HELLO\r\n\r\n")},
		{"smuggling", sendRaw(postPlain("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"))},
		{"100 Continue", sendRaw("POST http://plain.example.com/ HTTP/1.1\r\nHost: plain.example.com\r\nExpect: 100-continue\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello")},
		{"CONNECT's 200, then no ClientHello", func(t *testing.T, c net.Conn) {
			sendRaw(connectReq("pkg.example.com:443"))(t, c)
			if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := setup(t, func(c *Config) { c.Limits.MaxBytes = limit })
			read, last, stopped := 0, "", false
			for i := 0; i < 200 && !stopped; i++ {
				c := h.dialProxy(t)
				tt.send(t, c)
				b, _ := io.ReadAll(c) // the proxy closes every connection here once it is done
				c.Close()
				read += len(b)
				if stopped = len(b) == 0; !stopped {
					last = string(b)
				}
			}
			if !stopped {
				t.Fatalf("200 requests all answered: the sandbox read %d bytes, cap %d", read, limit)
			}
			if !strings.Contains(last, "X-Boxcar-Egress: byte_cap\r\n") {
				t.Errorf("the last answer before the silence was %q, want a byte_cap refusal", last)
			}
			if read > limit {
				t.Errorf("the sandbox read %d bytes, cap %d", read, limit)
			}
			var in int64
			for _, d := range h.all() {
				in += d.BytesIn
			}
			if in != int64(read) {
				t.Errorf("the decisions count %d bytes in, the sandbox read %d", in, read)
			}
			if used := h.proxy.bytes.Load(); used > limit {
				t.Errorf("the job moved %d bytes, cap %d", used, limit)
			}
		})
	}
}

// sendRaw writes payload on the connection.
func sendRaw(payload string) func(*testing.T, net.Conn) {
	return func(t *testing.T, c net.Conn) {
		if _, err := io.WriteString(c, payload); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAddrFilterComparesByServer: the worker's endpoints, the host's own addresses and the
// denied CIDRs were compared in the form the config or the resolver gave them, so one given
// in a NAT64 form (64:ff9b::a.b.c.d, the local-use 64:ff9b:1::/48, IPv4-compatible) left the
// IPv4 address of the same server open by another name or a literal. Each is denied under
// every form that reaches its server (addrFilter.servers).
func TestAddrFilterComparesByServer(t *testing.T) {
	r := &stubResolver{names: map[string][][]netip.Addr{"nats.internal": {{netip.MustParseAddr("64:ff9b::c612:14")}}}, calls: map[string]int{}}
	f, err := newAddrFilter(Config{
		AllowedCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("64:ff9b::/96"), netip.MustParsePrefix("64:ff9b:1::/48")},
		DeniedCIDRs:  []netip.Prefix{netip.MustParsePrefix("64:ff9b::c613:0/112")}, // 198.19.0.0/16, as DNS64 gives it
		HostAddrs:    []netip.Addr{netip.MustParseAddr("64:ff9b:1::c612:63")},      // 198.18.0.99
		WorkerEndpoints: []string{"nats.internal:4222", // resolves to 198.18.0.20 through NAT64
			"[64:ff9b::c612:15]:9000"}, // 198.18.0.21 as a literal
		Resolver: r, Limits: Limits{DialTimeout: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		addr string
		port int
		want Reason
	}{
		{"198.18.0.20", 4222, ReasonWorkerEndpoint},
		{"64:ff9b:1::c612:14", 4222, ReasonWorkerEndpoint},
		{"198.18.0.20", 8222, ReasonWorkerEndpoint}, // another port of its host
		{"198.18.0.21", 9000, ReasonWorkerEndpoint},
		{"::ffff:198.18.0.21", 9000, ReasonWorkerEndpoint},
		{"198.18.0.99", 443, ReasonDeniedAddress},
		{"64:ff9b::c612:63", 443, ReasonDeniedAddress},
		{"198.19.1.1", 443, ReasonDeniedAddress},
		{"64:ff9b:1::c613:101", 443, ReasonDeniedAddress},
		{"198.18.0.1", 443, ""},
		{"64:ff9b::c612:1", 443, ""},
	}
	for _, tt := range tests {
		if r, d := f.check(netip.MustParseAddr(tt.addr), tt.port, false, tt.addr); r != tt.want {
			t.Errorf("check(%s, %d) = %q (%s), want %q", tt.addr, tt.port, r, d, tt.want)
		}
	}
}

// TestDeniedNAT64PrefixDeniesItsFormsAlone: a denied CIDR that is a whole /96 of an IPv4-
// carrying form (NAT64's, IPv4-compatible, a /96 of nat64_prefixes) denies the addresses in
// that form, not every IPv4 address: widened to the IPv4 prefix its last 32 bits cover, it
// denied 0.0.0.0/0, 8.8.8.8 and the lifted 198.18.0.1 with it. A longer one still denies its
// IPv4 prefix (TestAddrFilterComparesByServer).
func TestDeniedNAT64PrefixDeniesItsFormsAlone(t *testing.T) {
	for _, denied := range []string{"64:ff9b::/96", "::/96", "2001:db8:64::/96"} {
		t.Run(denied, func(t *testing.T) {
			f, err := newAddrFilter(Config{
				AllowedCIDRs:  []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")},
				DeniedCIDRs:   []netip.Prefix{netip.MustParsePrefix(denied)},
				NAT64Prefixes: []netip.Prefix{netip.MustParsePrefix("2001:db8:64::/96")},
				Resolver:      &stubResolver{calls: map[string]int{}}, Limits: Limits{DialTimeout: time.Second},
			})
			if err != nil {
				t.Fatal(err)
			}
			inForm := netip.PrefixFrom(netip.MustParsePrefix(denied).Addr(), 96).Addr().As16()
			copy(inForm[12:], []byte{8, 8, 8, 8})
			for addr, want := range map[string]Reason{"8.8.8.8": "", "198.18.0.1": "",
				netip.AddrFrom16(inForm).String(): ReasonDeniedAddress} {
				if r, d := f.check(netip.MustParseAddr(addr), 443, false, addr); r != want {
					t.Errorf("check(%s, 443) = %q (%s), want %q", addr, r, d, want)
				}
			}
		})
	}
}

// TestHostsTeredoServerIsNotTheHost: a Teredo address (2001:0::/32) carries its client's
// IPv4 address, the host's own outside its NAT, and the address of the Teredo server it
// qualified with, a third party's. Keyed by every IPv4 address it carries, a Teredo address
// of this host, or of a worker endpoint, had the server refused as that host.
func TestHostsTeredoServerIsNotTheHost(t *testing.T) {
	// Server 198.18.0.88, client 198.18.0.77 (stored XOR 0xffffffff: 39ed:ffb2).
	teredo := netip.MustParseAddr("2001:0:c612:58::39ed:ffb2")
	for _, tt := range []struct {
		name   string
		cfg    Config
		client Reason
	}{
		{"the host's address", Config{HostAddrs: []netip.Addr{teredo}}, ReasonDeniedAddress},
		{"a worker endpoint", Config{WorkerEndpoints: []string{"[" + teredo.String() + "]:4222"}}, ReasonWorkerEndpoint},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.AllowedCIDRs = []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}
			tt.cfg.Resolver, tt.cfg.Limits = &stubResolver{calls: map[string]int{}}, Limits{DialTimeout: time.Second}
			f, err := newAddrFilter(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			for addr, want := range map[string]Reason{"198.18.0.88": "", "198.18.0.77": tt.client} {
				if r, d := f.check(netip.MustParseAddr(addr), 4222, false, addr); r != want {
					t.Errorf("check(%s, 4222) = %q (%s), want %q", addr, r, d, want)
				}
			}
		})
	}
}

// TestDeniedNAT64PrefixDeniesItsIPv4Prefix: a denied CIDR inside a NAT64 prefix denies the
// IPv4 prefix its bits cover where RFC 6052 puts the IPv4 address under that prefix's length
// (skipping the u octet), and an address is read so: the local-use 64:ff9b:1::/48 was read as
// a /96 (its last 32 bits) inside a /64 of egress.nat64_prefixes too, so a denied /128 there
// denied 5.0.0.0 and left 198.19.0.5 open, a denied /97 denied 0.0.0.0/1, and 198.19.0.0 was
// refused as 0.0.0.0; a prefix of a global /64 was not widened at all.
func TestDeniedNAT64PrefixDeniesItsIPv4Prefix(t *testing.T) {
	for _, tt := range []struct {
		name          string
		nat64, denied []string
		allowed       []string // besides 198.18.0.0/15
		want          map[string]Reason
	}{
		{"a /97 of 64:ff9b::/96", nil, []string{"64:ff9b::/97"}, nil,
			map[string]Reason{"8.8.8.8": ReasonDeniedAddress, "198.18.0.1": "", "64:ff9b::c612:1": ReasonDeniedAddress}},
		{"a /128 of 64:ff9b::/96", nil, []string{"64:ff9b::c613:5/128"}, nil,
			map[string]Reason{"198.19.0.5": ReasonDeniedAddress, "198.19.0.6": ""}},
		{"a /112 of a local-use /96", nil, []string{"64:ff9b:1:ab::c613:0/112"}, nil,
			map[string]Reason{"198.19.0.5": ReasonDeniedAddress, "198.18.0.5": ""}},
		{"a /112 of a global /96", []string{"2001:db8:64::/96"}, []string{"2001:db8:64::c613:0/112"}, nil,
			map[string]Reason{"198.19.0.5": ReasonDeniedAddress, "198.18.0.5": ""}},
		{"a /128 of a local-use /64", []string{"64:ff9b:1:ab::/64"}, []string{"64:ff9b:1:ab:c6:1300:500:0/128"}, nil,
			map[string]Reason{"198.19.0.5": ReasonDeniedAddress, "5.0.0.0": "", "198.19.0.6": ""}},
		{"a /97 of a local-use /64", []string{"64:ff9b:1:ab::/64"}, []string{"64:ff9b:1:ab:c6:1300::/97"}, nil,
			map[string]Reason{"198.19.0.5": ReasonDeniedAddress, "198.19.0.200": "", "8.8.8.8": ""}},
		{"a /88 of a global /64", []string{"2001:db8:64::/64"}, []string{"2001:db8:64:0:c6:1300::/88"}, nil,
			map[string]Reason{"198.19.0.5": ReasonDeniedAddress, "198.18.0.5": ""}},
		{"a /72 of a global /64: its u octet, no IPv4 bit", []string{"2001:db8:64::/64"}, []string{"2001:db8:64::/72"}, nil,
			map[string]Reason{"8.8.8.8": "", "198.18.0.5": "", "2001:db8:64:0:8:808:800:0": ReasonDeniedAddress}},
		{"a /56 of a /40", []string{"2001:db8:6400::/40"}, []string{"2001:db8:64c6:1300::/56"}, nil,
			map[string]Reason{"198.19.0.5": ReasonDeniedAddress, "198.18.0.5": ""}},
		{"an address of a local-use /64, lifted, is its IPv4 address under the /64", []string{"64:ff9b:1:ab::/64"}, nil, []string{"64:ff9b:1:ab::/64"},
			map[string]Reason{"64:ff9b:1:ab:c6:1300:0:0": "", "64:ff9b:1:ab:c6:12ff:ff00:0": "", "64:ff9b:1:ab:a9:fea9:fe00:0": ReasonDeniedAddress}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{AllowedCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")},
				Resolver: &stubResolver{calls: map[string]int{}}, Limits: Limits{DialTimeout: time.Second}}
			for _, s := range tt.nat64 {
				cfg.NAT64Prefixes = append(cfg.NAT64Prefixes, netip.MustParsePrefix(s))
			}
			for _, s := range tt.denied {
				cfg.DeniedCIDRs = append(cfg.DeniedCIDRs, netip.MustParsePrefix(s))
			}
			for _, s := range tt.allowed {
				cfg.AllowedCIDRs = append(cfg.AllowedCIDRs, netip.MustParsePrefix(s))
			}
			f, err := newAddrFilter(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for addr, want := range tt.want {
				if r, d := f.check(netip.MustParseAddr(addr), 443, false, addr); r != want {
					t.Errorf("check(%s, 443) = %q (%s), want %q", addr, r, d, want)
				}
			}
		})
	}
}
