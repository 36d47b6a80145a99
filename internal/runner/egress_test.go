package runner_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/egress"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/test/harness"
	"github.com/boxcar-run/boxcar/test/testcert"
)

const egressProfiles = `
concurrency: 1
nats: {ack_wait: 3s, max_deliver: 3, retry_backoff: 200ms}
profiles:
  p:
    model: {name: m}
    tools: [{name: read_file}]
  net:
    model: {name: m}
    tools: [{name: read_file}]
    network: {allow: [api.boxcar.test]}
    secrets: [{env: API_TOKEN, from: 'env:BOXCAR_TEST_API_TOKEN', hosts: [api.boxcar.test]}]
`

// egressSandbox is a fake sandbox with egress: its commands are one HTTPS request, made with
// the command's environment through the listener AttachEgress returned.
type egressSandbox struct {
	*fakeSandbox
	mu  sync.Mutex
	ln  net.Listener
	ca  []byte
	env map[string]string
}

func (s *egressSandbox) AttachEgress(ctx context.Context, caPEM []byte) (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ln, s.ca = ln, caPEM
	return ln, nil
}

func (s *egressSandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	s.mu.Lock()
	s.env = req.Env
	addr, ca := s.ln.Addr().String(), s.ca
	s.mu.Unlock()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	proxy := &url.URL{Scheme: "http", Host: addr} // where the sandbox's 127.0.0.1:3128 leads
	client := &http.Client{Transport: &http.Transport{
		Proxy:           http.ProxyURL(proxy),
		TLSClientConfig: &tls.Config{RootCAs: roots},
	}}
	hreq, _ := http.NewRequestWithContext(ctx, http.MethodGet, req.Argv[0], nil)
	hreq.Header.Set("Authorization", "Bearer "+req.Env["API_TOKEN"])
	resp, err := client.Do(hreq)
	if err != nil {
		return sandbox.ExecResult{ExitCode: 1, Stderr: []byte(err.Error())}, nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return sandbox.ExecResult{Stdout: body}, nil
}

type egressProvider struct {
	fakeProvider
	mu   sync.Mutex // the worker starts sandboxes while the test looks at the last one
	last *egressSandbox
}

func (p *egressProvider) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, _ := p.fakeProvider.Start(ctx, spec)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last = &egressSandbox{fakeSandbox: sb.(*fakeSandbox)}
	return p.last, nil
}

// lastEnv is the environment of the last command run in the last sandbox started.
func (p *egressProvider) lastEnv() map[string]string {
	p.mu.Lock()
	s := p.last
	p.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.env
}

// stubResolver answers the test's names; anything else does not resolve.
type stubResolver map[string]netip.Addr

func (r stubResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[strings.TrimSuffix(host, ".")]; ok { // the proxy asks for the name fully qualified
		return []netip.Addr{a}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// toServer dials the test's loopback server whatever checked address the proxy asks for, so
// that no packet leaves loopback.
type toServer string

func (s toServer) DialContext(ctx context.Context, network, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, string(s))
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// egressSetup is setup with the egress profiles.
func egressSetup(t *testing.T) *bundle {
	t.Helper()
	b := setup(t)
	cfg, err := config.Parse([]byte(egressProfiles))
	if err != nil {
		t.Fatal(err)
	}
	b.cfg = cfg
	return b
}

// egressUpstream starts the HTTPS server api.boxcar.test stands for, which answers "answer"
// and hands each request's Authorization header to seen, and returns the proxy's
// configuration that leads there: the name resolves to 198.18.0.10, every dial reaches the
// server on loopback.
func egressUpstream(t *testing.T, seen func(auth string)) egress.Config {
	t.Helper()
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen(r.Header.Get("Authorization"))
		_, _ = w.Write([]byte("answer"))
	}))
	cert, upCA := testcert.SelfSigned(t, "api.boxcar.test")
	up.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	up.StartTLS()
	t.Cleanup(up.Close)
	return egress.Config{
		Resolver:      stubResolver{"api.boxcar.test": netip.MustParseAddr("198.18.0.10")},
		Dialer:        toServer(up.Listener.Addr().String()),
		AllowedCIDRs:  []netip.Prefix{netip.MustParsePrefix("198.18.0.10/32")},
		UpstreamCAPEM: upCA,
	}
}

// TestEgressWiring: a job of a profile with a network gets its proxy: the command's
// environment names the proxy and a placeholder, the upstream gets the real value over TLS,
// the transcript holds the decision and the manifest the summary, and neither they, the
// report, the logs nor the metrics hold the real value.
func TestEgressWiring(t *testing.T) {
	t.Parallel()
	const secret = "real-api-token-0123456789abcdef"
	var seen []string
	var mu sync.Mutex
	up := egressUpstream(t, func(auth string) {
		mu.Lock()
		seen = append(seen, auth)
		mu.Unlock()
	})

	b := egressSetup(t)
	var logs harness.LogBuffer
	p := &egressProvider{}
	w := b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		res, err := req.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: []string{"https://api.boxcar.test/v1"}})
		if err != nil || string(res.Stdout) != "answer" {
			return agent.Result{}, errors.New("the request through the proxy failed: " + string(res.Stderr))
		}
		return writeReport(ctx, req)
	}), func(c *runner.Config) {
		c.Sandboxes = p
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.LookupEnv = func(k string) (string, bool) { return secret, k == "BOXCAR_TEST_API_TOKEN" }
		c.Egress = up
	})
	j := b.submit("net")
	if st := b.waitFinal(j.ID, time.Minute); st.State != job.StateSucceeded {
		t.Fatalf("job ended %s: %s", st.State, st.Error)
	}
	env := p.lastEnv()
	if env["HTTPS_PROXY"] != "http://"+sandbox.EgressAddr || env["API_TOKEN"] == "" || env["API_TOKEN"] == secret || env["SSL_CERT_FILE"] != sandbox.EgressCAFile {
		t.Errorf("the command's environment names no proxy, CA or placeholder (HTTPS_PROXY %q, SSL_CERT_FILE %q, API_TOKEN is the real value: %v)",
			env["HTTPS_PROXY"], env["SSL_CERT_FILE"], env["API_TOKEN"] == secret)
	}
	mu.Lock()
	if len(seen) != 1 || seen[0] != "Bearer "+secret {
		t.Errorf("the upstream saw %d requests, the first with the real value: %v", len(seen), len(seen) == 1 && seen[0] == "Bearer "+secret)
	}
	mu.Unlock()

	m := b.manifest(j.ID).Predicate.Egress
	if m == nil || len(m.Hosts) != 1 || m.Hosts[0].Host != "api.boxcar.test" || m.Hosts[0].Requests != 1 || len(m.SecretsUsed) != 1 || m.SecretsUsed[0] != "API_TOKEN" {
		t.Errorf("manifest egress %+v; want one request to api.boxcar.test (the GET inside the terminated tunnel: its CONNECT sends the host nothing) using API_TOKEN", m)
	}
	transcript := b.runFile(j.ID, "transcript.jsonl")
	if !bytes.Contains(transcript, []byte(`"type":"egress"`)) || !bytes.Contains(transcript, []byte(`"type":"egress_summary"`)) {
		t.Errorf("the transcript holds no egress decision and summary:\n%s", transcript)
	}
	noSecretIn(t, secret, map[string][]byte{
		"transcript": transcript, "report": b.runFile(j.ID, "report.md"), "manifest": mustJSON(t, b.manifest(j.ID)),
		"logs": logs.Bytes(), "metrics": gathered(t, w),
	})
}

func noSecretIn(t *testing.T, secret string, places map[string][]byte) {
	t.Helper()
	for name, data := range places {
		if bytes.Contains(data, []byte(secret)) {
			t.Errorf("the %s holds the real secret", name)
		}
	}
}

// gathered is the worker's metrics as text.
func gathered(t *testing.T, w *worker) []byte {
	t.Helper()
	mfs, err := w.m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for _, mf := range mfs {
		b.WriteString(mf.String())
	}
	return b.Bytes()
}

// TestEgressNeedsABackendWithIt: a profile with a network on a backend that gives sandboxes
// none fails at once, for good, saying so.
func TestEgressNeedsABackendWithIt(t *testing.T) {
	t.Parallel()
	b := egressSetup(t)
	b.worker(agentFunc(writeReport), func(c *runner.Config) {
		c.LookupEnv = func(string) (string, bool) { return "x", true }
	})
	j := b.submit("net")
	st := b.waitFinal(j.ID, time.Minute)
	if st.State != job.StateFailed || st.Attempt != 1 || !strings.Contains(st.Error, "gives sandboxes none") {
		t.Errorf("job ended %s at attempt %d: %q; want failed at the first, naming the backend", st.State, st.Attempt, st.Error)
	}
}

// TestEgressSecretMidRotationRetries: a secret is read for each job, and a file read while it
// is being rewritten can give a value the proxy cannot use (here too short for a placeholder).
// The worker checked the value at start, so the job is retried, not failed as the profile's
// fault.
func TestEgressSecretMidRotationRetries(t *testing.T) {
	t.Parallel()
	b := egressSetup(t)
	b.worker(agentFunc(writeReport), func(c *runner.Config) {
		c.Sandboxes = &egressProvider{}
		c.LookupEnv = func(k string) (string, bool) { return "tok-", k == "BOXCAR_TEST_API_TOKEN" }
		c.Egress = egressUpstream(t, func(string) {})
	})
	j := b.submit("net")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	updates, err := b.q.WatchStatus(ctx, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	for st := range updates {
		if st.State == job.StateRetrying || st.State.Terminal() {
			if st.State != job.StateRetrying || !strings.Contains(st.Error, "a secret of the profile cannot be read or used now") {
				t.Fatalf("the first attempt ended %s: %q; want retrying, saying the value cannot be used", st.State, st.Error)
			}
			return
		}
	}
	t.Fatal("the job's first attempt did not end within a minute")
}

// submitNetwork submits a job of profile that names its own network.allow.
func (b *bundle) submitNetwork(profile string, allow ...string) job.Job {
	b.t.Helper()
	j := job.Job{Version: job.Version, ID: job.NewID(), Profile: profile, Task: "t", SubmittedAt: time.Now().UTC(),
		Network: &job.Network{Allow: allow}}
	b.publish(j)
	return j
}

// TestEgressJobNarrowsItsProfile: a job may narrow its profile's network, never widen it; a
// widening ends at its first attempt, rejected, saying which entry, and starts no sandbox. A
// narrowing is what the proxy enforces: a host the profile allows and the job does not is
// refused.
func TestEgressJobNarrowsItsProfile(t *testing.T) {
	t.Parallel()
	const secret = "real-api-token-0123456789abcdef"
	up := egressUpstream(t, func(string) {})
	b := egressSetup(t)
	p := &egressProvider{}
	var mu sync.Mutex
	answers := map[string]string{} // job id -> what its one command printed, or its error
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		res, err := req.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: []string{"https://api.boxcar.test/v1"}})
		mu.Lock()
		answers[req.JobID] = string(res.Stdout) + string(res.Stderr)
		mu.Unlock()
		if err != nil {
			return agent.Result{}, err
		}
		return writeReport(ctx, req)
	}), func(c *runner.Config) {
		c.Sandboxes = p
		c.LookupEnv = func(k string) (string, bool) { return secret, k == "BOXCAR_TEST_API_TOKEN" }
		c.Egress = up
	})
	for _, tt := range []struct {
		name    string
		profile string
		allow   []string
		state   job.State
		says    string // in the status's error, or in the command's answer
	}{
		{name: "another host", profile: "net", allow: []string{"evil.boxcar.test"}, state: job.StateRejected, says: `"evil.boxcar.test" is not within the profile's allow list`},
		{name: "a wildcard over the profile's host", profile: "net", allow: []string{"*.boxcar.test"}, state: job.StateRejected, says: `"*.boxcar.test" is not within`},
		{name: "a network on a profile without one", profile: "p", allow: []string{"api.boxcar.test"}, state: job.StateRejected, says: "profile p has no network"},
		{name: "the profile's host on its port", profile: "net", allow: []string{"api.boxcar.test:443"}, state: job.StateSucceeded, says: "answer"},
		{name: "the profile's host on another port only", profile: "net", allow: []string{"api.boxcar.test:8443"}, state: job.StateSucceeded, says: "Forbidden"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			j := b.submitNetwork(tt.profile, tt.allow...)
			st := b.waitFinal(j.ID, time.Minute)
			if st.State != tt.state || st.Attempt != 1 {
				t.Fatalf("job ended %s at attempt %d (%q), want %s at the first", st.State, st.Attempt, st.Error, tt.state)
			}
			mu.Lock()
			answer, ran := answers[j.ID]
			mu.Unlock()
			if tt.state == job.StateRejected {
				if !strings.Contains(st.Error, tt.says) || ran {
					t.Errorf("error %q (the agent ran: %v), want it to say %q and no run", st.Error, ran, tt.says)
				}
				return
			}
			if !strings.Contains(answer, tt.says) {
				t.Errorf("the command got %q, want %q", answer, tt.says)
			}
		})
	}
	reasons := map[string]int{}
	for _, dl := range b.settledLetters() {
		reasons[dl.Reason]++
	}
	if reasons["network_not_allowed"] != 3 {
		t.Errorf("dead letters by reason %v, want 3 network_not_allowed", reasons)
	}
}

// stalledAttachProvider starts sandboxes whose AttachEgress never ends until its context does:
// a bridge that does not come up, a pod exec that hangs, a warm pod's session that never
// answers the egress request.
type stalledAttachProvider struct {
	egressProvider
	attaching chan struct{} // closed when the first attach begins
	once      sync.Once
}

func (p *stalledAttachProvider) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := p.egressProvider.Start(ctx, spec)
	return stalledAttach{egressSandbox: sb.(*egressSandbox), p: p}, err
}

type stalledAttach struct {
	*egressSandbox
	p *stalledAttachProvider
}

func (s stalledAttach) AttachEgress(ctx context.Context, _ []byte) (net.Listener, error) {
	s.p.once.Do(func() { close(s.p.attaching) })
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestJobTimeoutBoundsAStalledEgressAttach: attaching the job's proxy to its sandbox never
// ends, on the job's last delivery. The attach gives up when the run must start to keep its
// job_timeout, as the sandbox's start and the input copy do, and the job ends dead with its own
// error, which names the attach and the bound; the agent never runs. Without the bound the
// attempt held the job running and its slot for ever.
func TestJobTimeoutBoundsAStalledEgressAttach(t *testing.T) {
	t.Parallel()
	b := egressSetup(t)
	oneDelivery(b)
	p := b.cfg.Profiles["net"]
	p.Limits.JobTimeout = config.Duration(time.Second)
	b.cfg.Profiles = map[string]config.Profile{"net": p}
	prov := &stalledAttachProvider{attaching: make(chan struct{})}
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		t.Errorf("the agent ran in a sandbox whose egress was never attached")
		return writeReport(ctx, req)
	}), func(c *runner.Config) {
		c.Sandboxes = prov
		c.LookupEnv = func(k string) (string, bool) { return "real-api-token-0123456789abcdef", k == "BOXCAR_TEST_API_TOKEN" }
		c.Egress = egressUpstream(t, func(string) {})
	})
	j := b.submit("net")
	<-prov.attaching
	st := b.waitFinal(j.ID, time.Minute)
	if st.State != job.StateDead || !strings.Contains(st.Error, "network") || !strings.Contains(st.Error, "job_timeout") {
		t.Errorf("job whose egress attach stalled ended %s (%q); want dead by its own attempt, the attach and job_timeout named", st.State, st.Error)
	}
}

// listenerProvider records every listener its sandboxes' AttachEgress handed the worker, and
// whether the worker closed it.
type listenerProvider struct {
	egressProvider
	mu  sync.Mutex
	lns []*closeSeen
	// accept, when set, runs at each Accept of a listener handed out (a test's panic there).
	accept func()
}

func (p *listenerProvider) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := p.egressProvider.Start(ctx, spec)
	return listenerSandbox{egressSandbox: sb.(*egressSandbox), p: p}, err
}

// open is how many of the listeners handed out are not closed, of how many.
func (p *listenerProvider) open() (open, all int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ln := range p.lns {
		if !ln.closed.Load() {
			open++
		}
	}
	return open, len(p.lns)
}

type listenerSandbox struct {
	*egressSandbox
	p *listenerProvider
}

func (s listenerSandbox) AttachEgress(ctx context.Context, caPEM []byte) (net.Listener, error) {
	ln, err := s.egressSandbox.AttachEgress(ctx, caPEM)
	if err != nil {
		return nil, err
	}
	seen := &closeSeen{Listener: ln, accept: s.p.accept}
	s.p.mu.Lock()
	s.p.lns = append(s.p.lns, seen)
	s.p.mu.Unlock()
	return seen, nil
}

type closeSeen struct {
	net.Listener
	closed atomic.Bool
	accept func()
}

func (l *closeSeen) Accept() (net.Conn, error) {
	if l.accept != nil {
		l.accept()
	}
	return l.Listener.Accept()
}

func (l *closeSeen) Close() error {
	l.closed.Store(true)
	return l.Listener.Close()
}

// TestEgressListenerClosedWithItsAttempt: the listener a sandbox's AttachEgress hands the
// worker, the one way into the job's proxy, is closed by the time the attempt ends, however it
// ends: no listener outlives its job, and none is left for a later job's sandbox to reach
// (the proxy's goroutines are held to it by the package's goleak check).
func TestEgressListenerClosedWithItsAttempt(t *testing.T) {
	t.Parallel()
	up := egressUpstream(t, func(string) {})
	b := egressSetup(t)
	p := &listenerProvider{}
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		res, err := req.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: []string{"https://api.boxcar.test/v1"}})
		if err != nil || string(res.Stdout) != "answer" {
			return agent.Result{}, fmt.Errorf("the request through the proxy: %q, %v", res.Stderr, err)
		}
		if req.Task == "fail" {
			return agent.Result{}, queue.Permanent("test_failure", errors.New("the task fails after its request"))
		}
		return writeReport(ctx, req)
	}), func(c *runner.Config) {
		c.Sandboxes = p
		c.LookupEnv = func(k string) (string, bool) { return "real-api-token-0123456789abcdef", k == "BOXCAR_TEST_API_TOKEN" }
		c.Egress = up
	})
	for _, tt := range []struct {
		task  string
		state job.State
	}{
		{"succeed", job.StateSucceeded},
		{"fail", job.StateFailed},
		{"succeed", job.StateSucceeded},
	} {
		j := b.submitTask("net", tt.task)
		if st := b.waitFinal(j.ID, time.Minute); st.State != tt.state {
			t.Fatalf("job %q ended %s (%s), want %s", tt.task, st.State, st.Error, tt.state)
		}
		if open, all := p.open(); open != 0 || all == 0 {
			t.Fatalf("after the %q job: %d of the %d egress listeners attached are open", tt.task, open, all)
		}
	}
}
