package sandboxtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/egress"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/testnet"
)

// egressSuite is one sandbox with egress, its proxy, the upstream in a network namespace of
// the test's, and the listeners that must see nothing.
type egressSuite struct {
	sb       sandbox.Sandbox
	env      map[string]string
	ns       *testnet.Netns
	up       *upstream
	secret   string // the real value; it must never reach the sandbox
	endpoint string // a stand-in for the worker's own NATS or store port, on the host's loopback
	hostPort int    // a listener's port on the host's end of the veth
	canaries []*canary
	outputs  bytes.Buffer // everything commands printed, scanned for the secret at the end
	logs     bytes.Buffer
	reg      *prometheus.Registry

	mu        sync.Mutex
	decisions []egress.Decision
}

// RunEgress is the egress conformance suite: a profile allowing the test's package index
// (served in a network namespace the test made, at a 198.18.0.0/15 address) and a second host;
// curl, Python's urllib and pip install --require-hashes reach them through the worker's proxy;
// ways around it fail, judged from outside by listeners that must see nothing; and the real
// value of the profile's secret is found nowhere the sandbox or its records can show. It needs
// root, for the namespace.
func RunEgress(t *testing.T, p sandbox.Provider) {
	s := newEgressSuite(t, p)
	t.Run("canaries see the host", s.testCanariesLive)
	t.Run("reach", s.testReach)
	t.Run("secrets", s.testSecrets)
	t.Run("bypass", s.testBypass)
	t.Run("nothing reached the canaries", func(t *testing.T) {
		for _, c := range s.canaries {
			if n := c.hits.Load(); n != 0 {
				t.Errorf("%s saw %d connections or packets; want none", c.name, n)
			}
		}
	})
	t.Run("no secret anywhere", s.testNoSecret)
}

func newEgressSuite(t *testing.T, p sandbox.Provider) *egressSuite {
	t.Helper()
	s := &egressSuite{ns: testnet.NewNetns(t), reg: prometheus.NewRegistry()}
	var b [16]byte
	_, _ = rand.Read(b[:])
	s.secret = "realsecret" + hex.EncodeToString(b[:])
	caPEM, cert := testPKI(t)
	s.up = &upstream{caPEM: caPEM, wheel: demoWheel(t), auth: map[string][]string{}}
	tlsCfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	serveUpstream(t, s.up, s.ns.Listen(t, "tcp", 443).(net.Listener), tlsCfg)
	serveUpstream(t, s.up, s.ns.Listen(t, "tcp", 80).(net.Listener), nil)
	s.watch(t)

	cfg := egress.Config{
		Resolver:        stubResolver{indexHost: s.ns.Addr, otherHost: s.ns.Addr, "loop.boxcar.test": netip.MustParseAddr("127.0.0.1"), "own.boxcar.test": s.ns.HostAddr},
		AllowedCIDRs:    []netip.Prefix{netip.PrefixFrom(s.ns.Addr, 32)},
		UpstreamCAPEM:   caPEM,
		WorkerEndpoints: []string{s.endpoint},
		Limits:          egress.Limits{MaxTunnels: 8, HeaderTimeout: 5 * time.Second},
		Metrics:         egress.NewMetrics(s.reg),
		Logger:          slog.New(slog.NewJSONHandler(&s.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnDecision: func(d egress.Decision) {
			s.mu.Lock()
			s.decisions = append(s.decisions, d)
			s.mu.Unlock()
		},
	}
	policy := egress.Policy{
		Allow:   []string{indexHost, otherHost + ":443", "loop.boxcar.test", "own.boxcar.test"},
		Secrets: []egress.Secret{{Env: "BOXCAR_TEST_TOKEN", Value: s.secret, Hosts: []string{indexHost}}},
	}
	proxy, err := egress.New(cfg, policy)
	if err != nil {
		t.Fatalf("egress.New: %v", err)
	}
	s.sb = StartSpec(t, p, config.SandboxSpec{})
	eg, ok := sandbox.As[sandbox.Egress](s.sb)
	if !ok {
		t.Fatalf("the %s backend's sandboxes have no egress (sandbox.Egress)", p.Backend())
	}
	ln, err := eg.AttachEgress(t.Context(), append(proxy.CACertPEM(), caPEM...))
	if err != nil {
		t.Fatalf("AttachEgress: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = proxy.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	s.env = map[string]string{}
	for _, kv := range proxy.Env(sandbox.EgressAddr, sandbox.EgressCAFile) {
		k, v, _ := strings.Cut(kv, "=")
		s.env[k] = v
	}
	return s
}

// watch starts the listeners that must see nothing: ports of the namespace no rule allows, its
// DNS port, the host's end of the veth, and a stand-in for the worker's own endpoints.
func (s *egressSuite) watch(t *testing.T) {
	for _, port := range []int{8080, 22} {
		c := &canary{name: fmt.Sprintf("tcp %s:%d", s.ns.Addr, port)}
		c.watchTCP(s.ns.Listen(t, "tcp", port).(net.Listener))
		s.canaries = append(s.canaries, c)
	}
	dns := &canary{name: fmt.Sprintf("udp %s:53", s.ns.Addr)}
	dns.watchUDP(s.ns.Listen(t, "udp", 53).(net.PacketConn))
	s.canaries = append(s.canaries, dns)
	for _, addr := range []string{net.JoinHostPort(s.ns.HostAddr.String(), "0"), "127.0.0.1:0"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		c := &canary{name: "tcp " + ln.Addr().String()}
		c.watchTCP(ln)
		s.canaries = append(s.canaries, c)
		if strings.HasPrefix(addr, "127.") {
			s.endpoint = ln.Addr().String()
		} else {
			s.hostPort = ln.Addr().(*net.TCPAddr).Port
		}
	}
}

// testCanariesLive proves each listener that must see nothing does see what reaches it: a
// connection or datagram from the host's side, counted and then forgotten.
func (s *egressSuite) testCanariesLive(t *testing.T) {
	for _, c := range s.canaries {
		network, addr, _ := strings.Cut(c.name, " ")
		var conn net.Conn
		var err error
		if network == "udp" {
			conn, err = net.Dial("udp", addr)
			if err == nil {
				_, err = conn.Write([]byte("control"))
			}
		} else {
			conn, err = net.DialTimeout("tcp", addr, 10*time.Second)
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		conn.Close()
		deadline := time.Now().Add(30 * time.Second)
		for c.hits.Load() == 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // polling a counter the listener's goroutine sets
		}
		if c.hits.Swap(0) != 1 {
			t.Fatalf("%s did not count the host's own connection", c.name)
		}
	}
}

// sh runs a shell script in the sandbox with the proxy's environment (edit may change it).
func (s *egressSuite) sh(t *testing.T, script string, edit ...func(map[string]string)) sandbox.ExecResult {
	t.Helper()
	env := map[string]string{}
	for k, v := range s.env {
		env[k] = v
	}
	for _, e := range edit {
		e(env)
	}
	res, err := s.sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Env: env, Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatalf("Exec %q: %v", script, err)
	}
	s.outputs.Write(res.Stdout)
	s.outputs.Write(res.Stderr)
	return res
}

func (s *egressSuite) testReach(t *testing.T) {
	for _, tt := range []struct{ name, script, want string }{
		{"curl to the bound host (TLS terminated)", "curl -sS --max-time 30 https://" + indexHost + "/hello", "hello from " + indexHost},
		{"curl to another host (tunnel)", "curl -sS --max-time 30 https://" + otherHost + "/hello", "hello from " + otherHost},
		{"python urllib", `python3 -c "import urllib.request; print(urllib.request.urlopen('https://` + otherHost + `/hello', timeout=30).read().decode())"`, "hello from " + otherHost},
		{"pip install --require-hashes", s.pipScript(), "42"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := s.sh(t, tt.script)
			if res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != tt.want {
				t.Errorf("exit %d, stdout %q, want %q\nstderr: %s", res.ExitCode, res.Stdout, tt.want, res.Stderr)
			}
		})
	}
}

func (s *egressSuite) pipScript() string {
	sum := sha256.Sum256(s.up.wheel)
	return "set -e; cd \"$HOME\"; echo 'boxcar-demo==1.0 --hash=sha256:" + hex.EncodeToString(sum[:]) + "' > req.txt; " +
		"python3 -m pip install -q --no-cache-dir --disable-pip-version-check --break-system-packages --require-hashes --no-deps " +
		"--target site --index-url https://" + indexHost + "/simple/ -r req.txt >&2; " +
		`python3 -c "import sys; sys.path.insert(0, 'site'); import boxcar_demo; print(boxcar_demo.VALUE)"`
}

// testSecrets: the placeholder becomes the real value on TLS to the bound host only; sent
// anywhere else, or to the bound host in plain HTTP, it arrives unchanged.
func (s *egressSuite) testSecrets(t *testing.T) {
	placeholder := s.env["BOXCAR_TEST_TOKEN"]
	if placeholder == "" || placeholder == s.secret {
		t.Fatalf("the sandbox's BOXCAR_TEST_TOKEN is %q; want a placeholder", placeholder)
	}
	for _, tt := range []struct {
		name, url, host, want string
	}{
		{"bound host over TLS gets the real value", "https://" + indexHost + "/auth", indexHost, "Bearer " + s.secret},
		{"unbound host gets the placeholder", "https://" + otherHost + "/auth", otherHost, "Bearer " + placeholder},
		{"bound host over plain HTTP gets the placeholder", "http://" + indexHost + "/auth", indexHost, "Bearer " + placeholder},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := len(s.up.seen(tt.host))
			res := s.sh(t, `curl -sS --max-time 30 -H "Authorization: Bearer $BOXCAR_TEST_TOKEN" `+tt.url)
			seen := s.up.seen(tt.host)
			if res.ExitCode != 0 || len(seen) != before+1 {
				t.Fatalf("exit %d, upstream saw %d requests (want 1 more than %d); stderr %s", res.ExitCode, len(seen), before, res.Stderr)
			}
			if got := seen[len(seen)-1]; got != tt.want {
				t.Errorf("upstream saw Authorization of %d bytes, equal to the real value: %v, to the placeholder: %v; want %q",
					len(got), got == "Bearer "+s.secret, got == "Bearer "+placeholder, strings.Replace(tt.want, s.secret, "<real value>", 1))
			}
		})
	}
}

// testBypass: every way around the proxy fails. Whether it did is judged by the canaries at
// the end; a command that printed an upstream's answer fails here already.
func (s *egressSuite) testBypass(t *testing.T) {
	for _, tt := range s.bypasses() {
		t.Run(tt.name, func(t *testing.T) {
			var res sandbox.ExecResult
			if tt.edit != nil {
				res = s.sh(t, tt.script, tt.edit)
			} else {
				res = s.sh(t, tt.script)
			}
			out := string(res.Stdout)
			t.Logf("exit %d, stdout %q", res.ExitCode, strings.TrimSpace(out))
			switch {
			case tt.want != "" && !strings.Contains(out, tt.want):
				t.Errorf("exit %d, stdout %q, want %q; stderr %s", res.ExitCode, out, tt.want, res.Stderr)
			case tt.want == "" && (strings.Contains(out, "hello from") || strings.Contains(out, " 200 ")):
				t.Errorf("got through: exit %d, stdout %q", res.ExitCode, out)
			}
		})
	}
}

// bypass is one way around the proxy a command tries.
type bypass struct {
	name, script string
	edit         func(map[string]string) // changes the command's environment
	want         string                  // when set, the output must say it (the proxy's refusal, counted)
}

func unsetProxy(env map[string]string) {
	for k := range env {
		if strings.HasSuffix(strings.ToLower(k), "_proxy") {
			delete(env, k)
		}
	}
}

// bypasses are the attempts, as data (a table, not code).
func (s *egressSuite) bypasses() []bypass {
	a4 := s.ns.Addr.As4()
	dotted, ip32 := s.ns.Addr.String(), uint32(a4[0])<<24|uint32(a4[1])<<16|uint32(a4[2])<<8|uint32(a4[3])
	octal := fmt.Sprintf("0%o.0%o.0%o.0%o", a4[0], a4[1], a4[2], a4[3])
	hexa := fmt.Sprintf("0x%x", ip32)
	host := net.JoinHostPort(s.ns.HostAddr.String(), strconv.Itoa(s.hostPort))
	curl := "curl -sS --max-time 15 "
	epPort := s.endpoint[strings.LastIndex(s.endpoint, ":")+1:]
	mapped := fmt.Sprintf("::ffff:%x:%x", uint16(ip32>>16), uint16(ip32))
	return []bypass{
		{"direct TCP to the namespace", curl + "--noproxy '*' http://" + dotted + ":8080/", nil, ""},
		{"direct TCP from python", `python3 -c "import socket; socket.create_connection(('` + dotted + `', 8080), timeout=10)"`, nil, ""},
		{"direct TCP to the host's end", curl + "--noproxy '*' http://" + host + "/", nil, ""},
		{"UDP to the namespace's DNS port", `python3 -c "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('` + dotted + `', 53))"`, nil, ""},
		{"DNS lookup of the allowed host", "getent hosts " + indexHost, nil, ""},
		{"proxy variables unset", curl + "https://" + indexHost + "/hello", unsetProxy, ""},
		{"dotted IP literal", curl + "http://" + dotted + ":8080/", nil, ""},
		{"dotted IP literal on an allowed port", curl + "https://" + dotted + "/hello", nil, ""},
		{"decimal IP literal", curl + "http://" + strconv.FormatUint(uint64(ip32), 10) + ":8080/", nil, ""},
		{"octal IP literal", curl + "http://" + octal + ":8080/", nil, ""},
		{"hex IP literal", curl + "http://" + hexa + ":8080/", nil, ""},
		{"IPv4-mapped IPv6 literal", curl + "-g http://[::ffff:" + dotted + "]:8080/", nil, ""},
		{"tunnel to an IP literal", curl + "-p http://" + dotted + ":22/", nil, ""},
		{"tunnel to the worker's endpoint", curl + "-p http://" + s.endpoint + "/", nil, ""},
		{"forward to the worker's endpoint", curl + "http://" + s.endpoint + "/", nil, ""},
		{"name resolving to loopback", curl + "http://loop.boxcar.test:" + s.endpoint[strings.LastIndex(s.endpoint, ":")+1:] + "/", nil, ""},
		{"name resolving to the host's own address", curl + "http://own.boxcar.test:" + strconv.Itoa(s.hostPort) + "/", nil, ""},
		{"allowed host on a port not allowed", curl + "https://" + otherHost + ":8080/", nil, ""},
		{"host not allowed", curl + "https://example.com/", nil, ""},
		{"Host differs from the target", curl + "-H 'Host: " + dotted + ":8080' http://" + indexHost + "/hello", nil, ""},
		{"SNI differs from the CONNECT host", curl + "--connect-to " + otherHost + ":443:" + dotted + ":22 -p https://" + otherHost + "/", nil, ""},
		{"raw CONNECT on the proxy socket", rawConnect(dotted + ":8080"), nil, ""},
		{"direct TCP to the worker's endpoint port", `python3 -c "import socket; socket.create_connection(('127.0.0.1', ` + epPort + `), timeout=10)"`, nil, ""},
		{"direct TCP to an IPv4-mapped literal", curl + "--noproxy '*' -g http://[::ffff:" + dotted + "]:8080/", nil, ""},
		{"IPv4-mapped literal in hex", curl + "-g http://[" + mapped + "]:8080/", nil, ""},
		{"NAT64 literal", curl + "-g http://[64:ff9b::" + dotted + "]:8080/", nil, ""},
		{"IPv4-compatible literal", curl + "-g http://[::" + dotted + "]:8080/", nil, ""},
		{"userinfo naming the allowed host", curl + "http://" + indexHost + "@" + dotted + ":8080/", nil, ""},
		{"allowed name on a port of the other host not allowed", curl + "-p http://" + otherHost + ":22/", nil, ""},
		{"tunnel to the proxy's own address", curl + "-p http://" + sandbox.EgressAddr + "/", nil, ""},
		{"IP literal target with the allowed Host", curl + "-H 'Host: " + indexHost + "' http://" + dotted + ":8080/", nil, ""},
		{"CL and TE smuggling a second request", rawProxy(`POST http://` + indexHost + `/hello HTTP/1.1\r\nHost: ` + indexHost + `\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET http://` + dotted + `:8080/ HTTP/1.1\r\nHost: ` + dotted + `:8080\r\n\r\n`), nil, ""},
		{"oversize header", rawProxy(`GET http://` + indexHost + `/hello HTTP/1.1\r\nHost: ` + indexHost + `\r\nX-Big: ' + 'a' * 70000 + '\r\n\r\n`), nil, ""},
		{"slow client", slowClient(dotted + ":8080"), nil, ""},
		{"more tunnels than the cap", tunnelsOverCap(otherHost + ":443"), nil, "capped"},
		{"IPv6 loopback literal", curl + "-g http://[::1]:" + epPort + "/", nil, ""},
		{"localhost by name", curl + "http://localhost:" + epPort + "/", nil, ""},
		{"dotted IP literal with a trailing dot", curl + "http://" + dotted + ".:8080/", nil, ""},
		{"three-part IP literal", curl + "http://" + fmt.Sprintf("%d.%d.%d", a4[0], a4[1], uint16(a4[2])<<8|uint16(a4[3])) + ":8080/", nil, ""},
		{"tunnel to the namespace's DNS port", curl + "-p http://" + dotted + ":53/", nil, ""},
		{"proxy variable pointing at the namespace", curl + "https://" + indexHost + "/hello", func(env map[string]string) {
			for _, k := range []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"} {
				env[k] = "http://" + dotted + ":8080"
			}
		}, ""},
	}
}

// rawConnect is a script that asks for a tunnel to target on the proxy's Unix socket, past
// the TCP listener, and prints the first line of the answer.
func rawConnect(target string) string {
	return `python3 -c "
import socket
s = socket.socket(socket.AF_UNIX); s.connect('` + "/run/boxcar/egress/proxy.sock" + `')
s.sendall(b'CONNECT ` + target + ` HTTP/1.1\r\nHost: ` + target + `\r\n\r\n')
print(s.recv(100).decode().split('\r\n')[0])"`
}

// slowClient is a script that sends half a request for target, waits past the proxy's header
// timeout, sends the rest and prints the first line of the answer (or that it was closed).
func slowClient(target string) string {
	return `python3 -c "
import socket, time
s = socket.create_connection(('127.0.0.1', 3128))
s.sendall(b'GET http://` + target + `/ HTTP/1.1\r\n')
time.sleep(7)
try:
    s.sendall(b'Host: ` + target + `\r\n\r\n'); print(s.recv(100).decode().split('\r\n')[0])
except OSError as e:
    print('closed', e)"`
}

// tunnelsOverCap is a script that opens 12 tunnels to target at once and prints "capped" when
// the proxy refused at least 4 of them.
func tunnelsOverCap(target string) string {
	return `python3 -c "
import socket
conns, refused = [], 0
for i in range(12):
    s = socket.create_connection(('127.0.0.1', 3128)); conns.append(s)
    s.sendall(b'CONNECT ` + target + ` HTTP/1.1\r\nHost: ` + target + `\r\n\r\n')
for s in conns:
    try:
        line = s.recv(100).decode().split('\r\n')[0]
    except OSError:
        line = ''
    refused += ' 200 ' not in line + ' '
print('capped' if refused >= 4 else 'refused=%d' % refused)"`
}

// rawProxy is a script that sends request (a Python string body) to the proxy as is and
// prints the first line of the answer.
func rawProxy(request string) string {
	return `python3 -c "
import socket
s = socket.create_connection(('127.0.0.1', 3128), timeout=20)
s.sendall(('` + request + `').encode())
try:
    print(s.recv(200).decode(errors='replace').split('\r\n')[0])
except OSError as e:
    print('closed', e)"`
}

// testNoSecret scans what the sandbox can see (its environment, every /proc/*/environ, its
// files) and what records the run (command output, decisions, proxy logs, metrics) for the real value.
func (s *egressSuite) testNoSecret(t *testing.T) {
	env := s.sh(t, `env; for f in /proc/[0-9]*/environ; do tr '\0' '\n' < "$f"; done 2>/dev/null; cat `+sandbox.EgressCAFile)
	if len(env.Stdout) == 0 {
		t.Fatal("the environment scan printed nothing")
	}
	files, err := s.sb.List(t.Context(), ".")
	if err != nil {
		t.Fatal(err)
	}
	var contents bytes.Buffer
	for _, f := range files {
		data, err := s.sb.ReadFile(t.Context(), f.Path, 64<<20)
		if err != nil {
			t.Fatalf("read %s: %v", f.Path, err)
		}
		contents.Write(data)
	}
	s.mu.Lock()
	decisions, _ := json.Marshal(s.decisions)
	s.mu.Unlock()
	var metrics bytes.Buffer
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		metrics.WriteString(mf.String())
	}
	for _, place := range []struct {
		name string
		data []byte
	}{
		{"command output", s.outputs.Bytes()},
		{"the sandbox's files", contents.Bytes()},
		{"decisions", decisions},
		{"proxy logs", s.logs.Bytes()},
		{"metrics", metrics.Bytes()},
	} {
		if n := bytes.Count(place.data, []byte(s.secret)); n != 0 {
			t.Errorf("%s hold the real secret %d times", place.name, n)
		}
	}
	if len(decisions) < 10 || !bytes.Contains(metrics.Bytes(), []byte("boxcar_egress_")) {
		t.Errorf("the scan saw %d bytes of decisions and no boxcar_egress_ metrics: it scanned nothing", len(decisions))
	}
}

// stubResolver answers the suite's names; anything else does not resolve.
type stubResolver map[string]netip.Addr

func (r stubResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[strings.TrimSuffix(strings.ToLower(host), ".")]; ok {
		return []netip.Addr{a}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}
