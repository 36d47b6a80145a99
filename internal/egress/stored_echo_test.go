package egress

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	testharness "github.com/boxcar-run/boxcar/test/harness"
)

// TestStoredEchoOverPlainHTTPIsScrubbed: a host a secret is bound to that keeps what it got
// (a request log, a stored field) and serves it on plain http:// too hands the value back on
// a forwarded request, which the proxy passed to the sandbox unscrubbed: the value went in on
// TLS, swapped for its placeholder, and came out of the same host by another scheme. A
// forwarded request to a host a secret is bound to, on any port, has its answer scrubbed of
// the host's values as a terminated tunnel's is, compressed or not.
func TestStoredEchoOverPlainHTTPIsScrubbed(t *testing.T) {
	h := newStoringHost(t).harness(t, testPolicy())
	ph := h.placeholder(t)
	if status, _ := get(t, h, "https://api.example.com/store", ph); status != http.StatusOK {
		t.Fatalf("storing: status %d", status)
	}
	for _, enc := range []string{"", "gzip"} {
		req, _ := http.NewRequest(http.MethodGet, "http://api.example.com/stored", nil)
		req.Header.Set("Accept-Encoding", enc)
		resp, err := h.client(t).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		seen := string(raw) + resp.Header.Get("X-Echo") + resp.Trailer.Get("X-Echo")
		if strings.Contains(seen, realToken) || resp.Header.Get("Content-Encoding") != "" {
			t.Errorf("Accept-Encoding %q: the sandbox read the stored value back over plain http (encoded %q)", enc, resp.Header.Get("Content-Encoding"))
		}
		if !strings.Contains(string(raw), ph) {
			t.Errorf("Accept-Encoding %q: the answer %q has not the placeholder", enc, redact(string(raw)))
		}
	}
}

// TestStoredEchoIsScrubbedWhereverItIsHeld: a value a host was sent is scrubbed from every
// answer of that host, on every path and port the job reaches it on, whatever the job's own
// list: a terminated tunnel was scrubbed of the secrets bound on its port alone, so a host
// that got one value on 443 served it back in clear on 8443, terminated for another secret
// bound there; and a job whose list narrowed a binding away (its variable unset) read in
// clear what an earlier job of the profile had the host store.
func TestStoredEchoIsScrubbedWhereverItIsHeld(t *testing.T) {
	other := Secret{Env: "OTHER_TOKEN", Value: "ot-OTHERvalue0123456789abcdefXYZ", Hosts: []string{"api.example.com"}}
	profile := Policy{Allow: []string{"api.example.com"}, Secrets: []Secret{
		{Env: "EXAMPLE_TOKEN", Value: realToken, Hosts: []string{"api.example.com:443"}}, other}}
	tests := []struct {
		name   string
		narrow []string // the reading job's own list; none: the profile's
		read   string
	}{
		{"terminated, on a port the value's binding leaves out", nil, "https://api.example.com:8443/stored"},
		{"terminated, for a job that narrowed the binding away", []string{"api.example.com:8443"}, "https://api.example.com:8443/stored"},
		{"forwarded, for a job that narrowed the binding away", []string{"api.example.com:80"}, "http://api.example.com/stored"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			newStoringHost(t).storeThenReadBack(t, profile, tt.narrow, tt.read)
		})
	}
}

// TestStoredEchoIsScrubbedUnderEveryName: a host that keeps a value it got (a request log, a
// stored field) serves it under every name and address it has, on every port. Spliced, to
// alias.example.com (another name of api.example.com's server), to its address (through NAT64
// too), or to a port of api.example.com the secret is not bound on, the proxy could not read
// the answer, and the sandbox read the stored value in clear; forwarded, or terminated for
// another secret, the answer was scrubbed of the values bound to the name asked for alone. A
// tunnel to an address a secret-bound host has is terminated, with nothing swapped in, and an
// answer from such an address is scrubbed of that host's values. The reading job is another
// than the storing one: it never asked for api.example.com.
func TestStoredEchoIsScrubbedUnderEveryName(t *testing.T) {
	bound := Secret{Env: "EXAMPLE_TOKEN", Value: realToken, Hosts: []string{"api.example.com:443"}}
	other := Secret{Env: "OTHER_TOKEN", Value: "ot-OTHERvalue0123456789abcdefXYZ", Hosts: []string{"alias.example.com"}}
	allow := []string{"api.example.com", "alias.example.com", apiAddr, "nat64.example.com"}
	tests := []struct {
		name    string
		secrets []Secret
		narrow  []string // the reading job's own list; none: the profile's
		read    string
	}{
		{"tunnel, another name of its server", []Secret{bound}, nil, "https://alias.example.com/stored"},
		{"tunnel, its address", []Secret{bound}, nil, "https://" + apiAddr + "/stored"},
		{"tunnel, a port the secret is not bound on", []Secret{bound}, nil, "https://api.example.com:8443/stored"},
		{"tunnel, its address through NAT64", []Secret{bound}, nil, "https://nat64.example.com/stored"},
		{"tunnel, for a job that narrowed the binding away", []Secret{bound}, []string{"api.example.com:8443"}, "https://api.example.com:8443/stored"},
		{"tunnel terminated for another secret, another name of its server", []Secret{bound, other}, nil, "https://alias.example.com/stored"},
		{"forwarded, another name of its server", []Secret{bound}, nil, "http://alias.example.com/stored"},
		{"forwarded, its address", []Secret{bound}, nil, "http://" + apiAddr + "/stored"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reader := newStoringHost(t).storeThenReadBack(t, Policy{Allow: allow, Secrets: tt.secrets}, tt.narrow, tt.read)
			if strings.HasPrefix(tt.read, "https") {
				if d := reader.waitDecision(t, "the tunnel's", withMethod(http.MethodConnect)); d.Reason != ReasonIntercepted {
					t.Errorf("the tunnel's decision %+v, want %s", d, ReasonIntercepted)
				}
			}
		})
	}
}

// storeThenReadBack has a job of policy send its placeholder to api.example.com/store, where
// the host keeps the real value, and then another job of policy (narrowed to narrow, when
// given) read read: the sandbox must see the echo, never the value in clear. It returns the
// reading job's harness.
func (s *storingHost) storeThenReadBack(t *testing.T, policy Policy, narrow []string, read string) *harness {
	t.Helper()
	writer := s.harness(t, policy)
	if status, _ := get(t, writer, "https://api.example.com/store", writer.placeholder(t)); status != http.StatusOK {
		t.Fatalf("storing: status %d", status)
	}
	if narrow != nil {
		var err error
		if policy, err = Narrow(policy, narrow); err != nil {
			t.Fatal(err)
		}
	}
	reader := s.harness(t, policy)
	resp, err := reader.client(t).Get(read)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if seen := string(raw) + resp.Header.Get("X-Echo") + resp.Trailer.Get("X-Echo"); strings.Contains(seen, realToken) || !strings.Contains(seen, "Bearer ") {
		t.Errorf("the sandbox read %q: the stored value in clear, or no echo at all", redact(seen))
	}
	return reader
}

// nat64API is api.example.com's address as NAT64's well-known prefix carries it.
var nat64API = netip.MustParseAddr("64:ff9b::" + apiAddr)

// storingHost is api.example.com keeping the Authorization it got on /store, serving it as
// a file on /piece and echoing it (echo) on every other path, over TLS on 443 and 8443 and over plain HTTP on 80. It reads
// header fields as a server that takes any character but a letter or digit for "-" does
// (foldedValues), as gunicorn before 22 and PHP behind lighttpd do.
type storingHost struct {
	caPEM          []byte
	tlsAddr, plain string
	mu             sync.Mutex
	stored         string
}

func newStoringHost(t *testing.T) *storingHost {
	s := &storingHost{}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		switch r.URL.Path {
		case "/store":
			s.stored = r.Header.Get("Authorization")
			return
		case "/piece": // the stored value as a file, served in the pieces a Range asks for
			r.Header["Range"] = []string{foldedValues(r.Header, "range")}
			http.ServeContent(w, r, "", time.Time{}, strings.NewReader(s.stored))
			return
		}
		echo(w, &http.Request{Header: http.Header{"X-Echo": {s.stored}, "Accept-Encoding": {foldedValues(r.Header, "accept-encoding")}}})
	})
	var leaf tls.Certificate
	s.caPEM, _, leaf = testUpstreamCert(t, "api.example.com", "alias.example.com", "nat64.example.com", apiAddr)
	tlsSrv := httptest.NewUnstartedServer(handler)
	tlsSrv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	tlsSrv.StartTLS()
	t.Cleanup(tlsSrv.Close)
	plainSrv := httptest.NewServer(handler)
	t.Cleanup(plainSrv.Close)
	s.tlsAddr, s.plain = tlsSrv.Listener.Addr().String(), plainSrv.Listener.Addr().String()
	return s
}

// harness is a job's proxy under policy whose api.example.com is s.
func (s *storingHost) harness(t *testing.T, policy Policy) *harness {
	return s.harnessWith(t, nil, policy)
}

// harnessWith is harness with the config adjusted by tweak too.
func (s *storingHost) harnessWith(t *testing.T, tweak func(*Config), policy Policy) *harness {
	h := setupPolicy(t, func(c *Config) {
		c.UpstreamCAPEM = s.caPEM
		c.AllowedCIDRs = append(c.AllowedCIDRs, netip.MustParsePrefix("64:ff9b::/96")) // a network with NAT64
		if tweak != nil {
			tweak(c)
		}
	}, policy)
	h.dialer.routes[apiAddr+":443"], h.dialer.routes[apiAddr+":8443"] = s.tlsAddr, s.tlsAddr
	h.dialer.routes[apiAddr+":80"] = s.plain
	h.dialer.routes[netip.AddrPortFrom(nat64API, 443).String()] = s.tlsAddr
	h.resolver.mu.Lock()
	h.resolver.names["alias.example.com"] = [][]netip.Addr{{netip.MustParseAddr(apiAddr)}} // another name of its server
	h.resolver.names["nat64.example.com"] = [][]netip.Addr{{nat64API}}                     // its address, through NAT64
	h.resolver.mu.Unlock()
	return h
}

// foldedValues is what a server that folds names (foldFieldName) reads as the field name: the
// values of every field that folds to it, joined as gunicorn joins a repeated field.
func foldedValues(h http.Header, name string) string {
	var vals []string
	for k, vv := range h {
		if foldFieldName(k) == name {
			vals = append(vals, vv...)
		}
	}
	return strings.Join(vals, ",")
}

// TestStoredEchoIsAskedForUncompressed: the proxy asks a host whose answers it scrubs for
// them uncompressed, and an Accept-Encoding the sandbox spelled with "_" or another character
// for "-" went upstream beside the proxy's identity: a server that folds names read gzip and
// compressed the stored value past the scrubber, on plain http:// and in a terminated tunnel.
func TestStoredEchoIsAskedForUncompressed(t *testing.T) {
	for _, url := range []string{"http://api.example.com/stored", "https://api.example.com/stored"} {
		for _, field := range []string{"Accept_Encoding", "Accept.Encoding", "accept~encoding"} {
			t.Run(url+" "+field, func(t *testing.T) {
				h := newStoringHost(t).harness(t, testPolicy())
				if status, _ := get(t, h, "https://api.example.com/store", h.placeholder(t)); status != http.StatusOK {
					t.Fatalf("storing: status %d", status)
				}
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				req.Header[field] = []string{"gzip"}
				req.Header.Set("Accept-Encoding", "identity") // the client takes no gzip of its own
				resp, err := h.client(t).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				raw, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if enc := resp.Header.Get("Content-Encoding"); enc != "" || strings.Contains(string(raw), realToken) {
					t.Errorf("the answer came %q-encoded (%d bytes), past the scrubber", enc, len(raw))
				}
			})
		}
	}
}

// TestStoredEchoIsReadWhole: a piece of a value is not the value, so the scrubber cannot know
// it; a host serving a stored value as a file answered the sandbox's Range with the token's
// first half in clear, and the rest with another. The proxy asks a host whose answers it
// scrubs for them whole, whatever the field's spelling.
func TestStoredEchoIsReadWhole(t *testing.T) {
	for _, url := range []string{"http://api.example.com/piece", "https://api.example.com/piece"} {
		for _, field := range []string{"Range", "RANGE"} {
			t.Run(url+" "+field, func(t *testing.T) {
				h := newStoringHost(t).harness(t, testPolicy())
				if status, _ := get(t, h, "https://api.example.com/store", h.placeholder(t)); status != http.StatusOK {
					t.Fatalf("storing: status %d", status)
				}
				half := realToken[:len(realToken)/2]
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				req.Header[field] = []string{fmt.Sprintf("bytes=%d-%d", len("Bearer "), len("Bearer ")+len(half)-1)}
				resp, err := h.client(t).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				raw, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if strings.Contains(string(raw), half) || resp.StatusCode != http.StatusOK {
					t.Errorf("status %d, %d bytes: the sandbox read a piece of the stored value in clear", resp.StatusCode, len(raw))
				}
			})
		}
	}
}

// TestStoredEchoOnAPooledConnectionIsScrubbed: a request in a terminated tunnel may go on an
// upstream connection kept from an earlier tunnel to the same name, dialled to the address
// that tunnel's resolution gave. alias.example.com, bound to a secret of its own, resolved
// first to api.example.com's address, then to one of its own: the second request went on the
// kept connection to api.example.com's server and its answer was scrubbed of the values held
// at the second address alone, so the value api.example.com stored came back in clear. An
// answer is scrubbed of the values held at the address of the connection it came on.
func TestStoredEchoOnAPooledConnectionIsScrubbed(t *testing.T) {
	const own = "198.18.0.30" // alias.example.com's second answer: a server that stored nothing
	bound := Secret{Env: "EXAMPLE_TOKEN", Value: realToken, Hosts: []string{"api.example.com:443"}}
	other := Secret{Env: "OTHER_TOKEN", Value: "ot-OTHERvalue0123456789abcdefXYZ", Hosts: []string{"alias.example.com"}}
	policy := Policy{Allow: []string{"api.example.com", "alias.example.com"}, Secrets: []Secret{bound, other}}
	s := newStoringHost(t)
	writer := s.harness(t, policy)
	if status, _ := get(t, writer, "https://api.example.com/store", writer.placeholder(t)); status != http.StatusOK {
		t.Fatalf("storing: status %d", status)
	}
	reader := s.harness(t, policy)
	reader.resolver.mu.Lock()
	reader.resolver.names["alias.example.com"] = [][]netip.Addr{{netip.MustParseAddr(apiAddr)}, {netip.MustParseAddr(own)}}
	reader.resolver.mu.Unlock()
	reader.dialer.mu.Lock()
	reader.dialer.routes[own+":443"] = reader.dialer.routes[pkgAddr+":443"]
	reader.dialer.mu.Unlock()
	for i := range 2 {
		resp, err := reader.client(t).Get("https://alias.example.com/stored")
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if seen := string(raw) + resp.Header.Get("X-Echo"); strings.Contains(seen, realToken) || !strings.Contains(seen, "Bearer ") {
			t.Errorf("request %d: the sandbox read %q: the stored value in clear, or no echo at all", i+1, redact(seen))
		}
	}
	if dialled := reader.dialer.seen(); len(dialled) != 1 {
		t.Fatalf("dialled %v, want one connection, kept for the second request", dialled)
	}
}

// TestHeldLookUpIsTriedAgain: the proxy learns the addresses of the names secrets are bound
// to once a job, and a look-up that failed (a time-out) was taken for a name that does not
// exist: every tunnel to another name of api.example.com's server was spliced for the rest of
// the job, and the sandbox read the stored value in clear. A look-up that failed but for the
// name not existing is made again, a dial_timeout later at the soonest.
func TestHeldLookUpIsTriedAgain(t *testing.T) {
	const wait = 3 * time.Second // the dial_timeout, and the least time between look-ups
	bound := Secret{Env: "EXAMPLE_TOKEN", Value: realToken, Hosts: []string{"api.example.com:443"}}
	policy := Policy{Allow: []string{"api.example.com", "alias.example.com"}, Secrets: []Secret{bound}}
	s := newStoringHost(t)
	writer := s.harness(t, policy)
	if status, _ := get(t, writer, "https://api.example.com/store", writer.placeholder(t)); status != http.StatusOK {
		t.Fatalf("storing: status %d", status)
	}
	reader := s.harnessWith(t, func(c *Config) { c.Limits.DialTimeout = wait }, policy)
	reader.resolver.mu.Lock()
	reader.resolver.fail = map[string]int{"api.example.com": 1}
	reader.resolver.mu.Unlock()
	client := reader.client(t)
	client.Transport.(*http.Transport).TLSClientConfig.RootCAs.AppendCertsFromPEM(s.caPEM) // spliced, the server's own
	tunnels := 0
	read := func() (string, Decision) {
		resp, err := client.Get("https://alias.example.com/stored")
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		tunnels++
		var d Decision
		testharness.Wait(t, "the tunnel's decision", func() (bool, error) {
			var connects []Decision
			for _, d := range reader.all() {
				if d.Method == http.MethodConnect {
					connects = append(connects, d)
				}
			}
			if len(connects) < tunnels {
				return false, fmt.Errorf("decided %+v", connects)
			}
			d = connects[tunnels-1]
			return true, nil
		}, testharness.Within(30*time.Second))
		return string(raw) + resp.Header.Get("X-Echo"), d
	}
	if _, d := read(); d.Reason != ReasonAllowed { // spliced: api.example.com's addresses unknown yet
		t.Fatalf("the first tunnel's decision %+v, want %s", d, ReasonAllowed)
	}
	time.Sleep(wait)
	if seen, d := read(); strings.Contains(seen, realToken) || d.Reason != ReasonIntercepted {
		t.Errorf("the sandbox read %q, the tunnel decided %+v: the stored value in clear, spliced", redact(seen), d)
	}
}

// TestStoredEchoIsScrubbedUnderEveryFormOfItsAddress: the same server has an IPv4 address and
// the IPv6 forms a network reaches it by (NAT64's 64:ff9b::a.b.c.d, the local-use
// 64:ff9b:1::/48, IPv4-mapped ::ffff:a.b.c.d). The proxy knew a bound host's address as held
// only in the form its resolver gave: bound at 64:ff9b::a.b.c.d, another name at a.b.c.d (or
// at the local-use form) was another server to it, so the tunnel was spliced and the sandbox
// read the stored value in clear. Addresses are compared by the server they reach.
func TestStoredEchoIsScrubbedUnderEveryFormOfItsAddress(t *testing.T) {
	bound := Secret{Env: "EXAMPLE_TOKEN", Value: realToken, Hosts: []string{"api.example.com:443"}}
	policy := Policy{Allow: []string{"api.example.com", "alias.example.com"}, Secrets: []Secret{bound}}
	v4 := netip.MustParseAddr(apiAddr)
	nat64 := netip.MustParseAddr("64:ff9b::" + apiAddr)
	local := netip.MustParseAddr("64:ff9b:1::" + apiAddr)
	mapped := netip.AddrFrom16(v4.As16())
	tests := []struct {
		name         string
		bound, alias netip.Addr // api.example.com's and alias.example.com's answers
	}{
		{"bound at its NAT64 form, the other name at its IPv4 address", nat64, v4},
		{"bound at its local-use NAT64 form, the other name at its IPv4 address", local, v4},
		{"bound at its NAT64 form, the other name at its local-use NAT64 form", nat64, local},
		{"bound at its IPv4 address, the other name at its local-use NAT64 form", v4, local},
		{"bound at its IPv4-mapped form, the other name at its NAT64 form", mapped, nat64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStoringHost(t)
			routed := func(c *Config) {
				c.AllowedCIDRs = append(c.AllowedCIDRs, netip.MustParsePrefix("64:ff9b:1::/48"))
			}
			route := func(h *harness) {
				h.resolver.mu.Lock()
				h.resolver.names["api.example.com"] = [][]netip.Addr{{tt.bound}}
				h.resolver.names["alias.example.com"] = [][]netip.Addr{{tt.alias}}
				h.resolver.mu.Unlock()
				h.dialer.mu.Lock()
				for _, a := range []netip.Addr{tt.bound, tt.alias} {
					h.dialer.routes[netip.AddrPortFrom(a.Unmap(), 443).String()] = s.tlsAddr
				}
				h.dialer.mu.Unlock()
			}
			writer := s.harnessWith(t, routed, policy)
			route(writer)
			if status, _ := get(t, writer, "https://api.example.com/store", writer.placeholder(t)); status != http.StatusOK {
				t.Fatalf("storing: status %d", status)
			}
			reader := s.harnessWith(t, routed, policy)
			route(reader)
			client := reader.client(t)
			client.Transport.(*http.Transport).TLSClientConfig.RootCAs.AppendCertsFromPEM(s.caPEM) // spliced, the server's own
			resp, err := client.Get("https://alias.example.com/stored")
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if seen := string(raw) + resp.Header.Get("X-Echo"); strings.Contains(seen, realToken) || !strings.Contains(seen, "Bearer ") {
				t.Errorf("the sandbox read %q: the stored value in clear, or no echo at all", redact(seen))
			}
			if d := reader.waitDecision(t, "the tunnel's", withMethod(http.MethodConnect)); d.Reason != ReasonIntercepted {
				t.Errorf("the tunnel's decision %+v, want %s", d, ReasonIntercepted)
			}
		})
	}
}

// TestHeldLookUpsWaitForNoOtherName: the proxy looked the bound names up one after another
// under one lock, so one slow answer (a name whose servers time out) held every other bound
// name's look-up, and every request of the job waited behind it, up to dial_timeout each
// time it was tried again. Each name is looked up on its own, at once, and a request still
// waits for every look-up in flight: a tunnel to another name of a bound host's server is
// terminated once the look-ups answer.
func TestHeldLookUpsWaitForNoOtherName(t *testing.T) {
	slow := Secret{Env: "SLOW_TOKEN", Value: "sl-SLOWvalue0123456789abcdefXYZ", Hosts: []string{"slow.example.com"}}
	bound := Secret{Env: "EXAMPLE_TOKEN", Value: realToken, Hosts: []string{"api.example.com:443"}}
	policy := Policy{Allow: []string{"api.example.com", "alias.example.com", "slow.example.com"}, Secrets: []Secret{slow, bound}}
	s := newStoringHost(t)
	writer := s.harness(t, policy)
	if status, _ := get(t, writer, "https://api.example.com/store", writer.placeholder(t)); status != http.StatusOK {
		t.Fatalf("storing: status %d", status)
	}
	reader := s.harnessWith(t, func(c *Config) { c.Limits.DialTimeout = 5 * time.Minute }, policy)
	release := make(chan struct{})
	reader.resolver.mu.Lock()
	reader.resolver.names["slow.example.com"] = [][]netip.Addr{{netip.MustParseAddr(pkgAddr)}}
	reader.resolver.block = map[string]chan struct{}{"slow.example.com": release}
	reader.resolver.mu.Unlock()
	type answer struct {
		seen string
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := reader.client(t).Get("https://alias.example.com/stored")
		if err != nil {
			done <- answer{err: err}
			return
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- answer{seen: string(raw) + resp.Header.Get("X-Echo")}
	}()
	asked := func(name string) bool {
		reader.resolver.mu.Lock()
		defer reader.resolver.mu.Unlock()
		for _, a := range reader.resolver.asked {
			if a == name {
				return true
			}
		}
		return false
	}
	testharness.Wait(t, "api.example.com's look-up beside slow.example.com's", func() (bool, error) {
		return asked("slow.example.com.") && asked("api.example.com."), nil
	}, testharness.Within(10*time.Second))
	select {
	case a := <-done:
		t.Fatalf("the request was answered (%v) before slow.example.com's look-up: decided without it", a.err)
	default:
	}
	close(release)
	a := <-done
	if a.err != nil {
		t.Fatal(a.err)
	}
	if strings.Contains(a.seen, realToken) || !strings.Contains(a.seen, "Bearer ") {
		t.Errorf("the sandbox read %q: the stored value in clear, or no echo at all", redact(a.seen))
	}
	if d := reader.waitDecision(t, "the tunnel's", withMethod(http.MethodConnect)); d.Reason != ReasonIntercepted {
		t.Errorf("the tunnel's decision %+v, want %s", d, ReasonIntercepted)
	}
}
