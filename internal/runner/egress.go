package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/egress"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// maxDecisionLines bounds the egress decisions one attempt writes to the transcript; the rest
// are counted in its egress_summary line (and all are in the manifest's summary).
const maxDecisionLines = 1000

// hostRoots are the host's CA bundles, the first found of them: a networked sandbox's
// commands trust them, with the job's CA, through SSL_CERT_FILE and the like.
var hostRoots = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem"}

// jobEgress is one attempt's network: the proxy serving the sandbox's egress listener, the
// environment each command gets, and the decisions for the transcript.
type jobEgress struct {
	proxy *egress.Proxy
	env   map[string]string
	stop  func() // ends Serve and waits for it; safe to call twice

	mu        sync.Mutex
	decisions []egress.Decision
	dropped   int
}

// startEgress gives the sandbox its job's proxy when the profile has a network; without one
// the sandbox keeps none. A backend that cannot carry egress fails the job for good: no other
// worker of this configuration can run it either.
func (r *Runner) startEgress(ctx context.Context, a *attempt, sb sandbox.Sandbox) (*jobEgress, error) {
	if a.profile.Network == nil {
		return nil, nil
	}
	eg, ok := sandbox.As[sandbox.Egress](sb)
	if !ok {
		return nil, fmt.Errorf("profile %s has a network, but the %s backend gives sandboxes none: %w", a.job.Profile, r.cfg.Sandboxes.Backend(), sandbox.ErrNoEgress)
	}
	policy, err := egressPolicy(a.job.Profile, a.profile, r.cfg.LookupEnv)
	if err != nil {
		return nil, err
	}
	if n := a.job.Network; n != nil {
		// admit checked it narrows; the profile's secrets keep the hosts it still allows.
		if policy, err = egress.Narrow(policy, n.Allow); err != nil {
			return nil, queue.Permanent("network_not_allowed", err)
		}
	}
	je := &jobEgress{}
	cfg := r.cfg.Egress
	cfg.OnDecision = je.record
	cfg.Logger = a.log
	cfg.Go = func(f func()) { a.goGuarded(ctx, "egress proxy's connection", f) }
	p, err := egress.New(cfg, policy)
	if err != nil {
		return nil, fmt.Errorf("egress of profile %s: %w", a.job.Profile, err)
	}
	ln, err := attach(ctx, a, eg, caBundle(p.CACertPEM(), cfg.UpstreamCAPEM))
	if err != nil {
		return nil, err
	}
	serveCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	a.goGuarded(ctx, "egress proxy", func() {
		defer close(done)
		if err := p.Serve(serveCtx, ln); err != nil {
			a.log.WarnContext(serveCtx, "egress proxy stopped", "error", err)
		}
	})
	// The listener closed here too: Serve closes it when ctx ends, but not after a panic.
	je.proxy, je.stop = p, sync.OnceFunc(func() { cancel(); <-done; ln.Close() })
	je.env = map[string]string{}
	for _, kv := range p.Env(sandbox.EgressAddr, sandbox.EgressCAFile) {
		k, v, _ := strings.Cut(kv, "=")
		je.env[k] = v
	}
	return je, nil
}

// attach attaches the proxy's listener to the sandbox, giving up when the run must start to
// keep its whole job_timeout, as the sandbox's start and the input copy do (beforeRun): a
// bridge that never comes up, or a pod exec that hangs, would otherwise hold the job running
// and its slot for ever, its heartbeats going on.
func attach(ctx context.Context, a *attempt, eg sandbox.Egress, caPEM []byte) (net.Listener, error) {
	ctx, cancel := beforeRun(ctx, a)
	defer cancel()
	ln, err := eg.AttachEgress(ctx, caPEM)
	if err != nil {
		return nil, startedLate(ctx, step(errEgressAttach, err))
	}
	return ln, nil
}

// narrowsNetwork checks that the job's own network, if it names one, only narrows its
// profile's: a job cannot give itself hosts, or a network its profile does not have.
func narrowsNetwork(j job.Job, p config.Profile) error {
	if j.Network == nil {
		return nil
	}
	if p.Network == nil {
		return fmt.Errorf("%w: the job asks for network.allow %q, and profile %s has no network", egress.ErrWiden, j.Network.Allow, j.Profile)
	}
	if _, err := egress.Narrow(egress.Policy{Allow: p.Network.Allow}, j.Network.Allow); err != nil {
		if errors.Is(err, egress.ErrInvalidPolicy) {
			return fmt.Errorf("%w: network.allow: %w", job.ErrInvalid, err)
		}
		return fmt.Errorf("profile %s: %w", j.Profile, err)
	}
	return nil
}

// CheckEgress checks a profile's network and secrets as each of its jobs' proxy will (its
// secrets read now, the proxy's own checks with cfg): the worker calls it at start, so that
// settings every job of the profile would fail on stop the worker instead.
// Its errors start with the profile's key in the config (profiles.NAME).
func CheckEgress(cfg egress.Config, name string, p config.Profile, lookupEnv func(string) (string, bool)) error {
	if p.Network == nil {
		return nil
	}
	policy, err := egressPolicy(name, p, lookupEnv)
	if err != nil {
		return err
	}
	if err := egress.Check(cfg, policy); err != nil {
		return fmt.Errorf("profiles.%s: %w", name, err)
	}
	return nil
}

// egressPolicy reads the profile's secrets now, so that a rotated value is used by the next
// job; a value that cannot be read is retried later, on this worker or another (classify).
// An error names the secret's key in the config (profiles.P.secrets[i].from) and its variable
// or file, never its value.
func egressPolicy(name string, p config.Profile, lookup func(string) (string, bool)) (egress.Policy, error) {
	policy := egress.Policy{Allow: p.Network.Allow}
	if lookup == nil {
		lookup = func(string) (string, bool) { return "", false }
	}
	for i, s := range p.Secrets {
		v, err := config.ReadSecret(s.From, lookup)
		if err != nil {
			return egress.Policy{}, fmt.Errorf("profiles.%s.secrets[%d].from (secret %s): %w", name, i, s.Env, err)
		}
		policy.Secrets = append(policy.Secrets, egress.Secret{Env: s.Env, Value: v, Hosts: s.Hosts})
	}
	return policy, nil
}

// caBundle is what the sandbox's TLS clients trust: the job's CA, the host's roots and the
// operator's upstream roots (for tunnels the proxy passes through untouched, the client checks
// the upstream itself).
func caBundle(jobCA, upstream []byte) []byte {
	bundle := append([]byte(nil), jobCA...)
	for _, name := range hostRoots {
		if data, err := os.ReadFile(name); err == nil {
			bundle = append(append(bundle, '\n'), data...)
			break
		}
	}
	if len(upstream) > 0 {
		bundle = append(append(bundle, '\n'), upstream...)
	}
	return bundle
}

// close stops the proxy on any way out of the attempt (endEgress may not have run).
func (je *jobEgress) close() {
	if je != nil {
		je.stop()
	}
}

func (je *jobEgress) record(d egress.Decision) {
	je.mu.Lock()
	defer je.mu.Unlock()
	if len(je.decisions) >= maxDecisionLines {
		je.dropped++
		return
	}
	je.decisions = append(je.decisions, d)
}

// wrap gives every command of sb the proxy's environment; without egress, sb as it is.
func (je *jobEgress) wrap(sb sandbox.Sandbox) sandbox.Sandbox {
	if je == nil {
		return sb
	}
	return egressEnv{Sandbox: sb, env: je.env}
}

// egressEnv sets the proxy's variables on each command, over any of the request's own.
type egressEnv struct {
	sandbox.Sandbox
	env map[string]string
}

// Unwrap returns the sandbox beneath, for sandbox.As.
func (s egressEnv) Unwrap() sandbox.Sandbox { return s.Sandbox }

func (s egressEnv) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	env := maps.Clone(req.Env)
	if env == nil {
		env = make(map[string]string, len(s.env))
	}
	maps.Copy(env, s.env)
	req.Env = env
	return s.Sandbox.Exec(ctx, req)
}

// egressReserve is the part of max_transcript_bytes (limit) a networked run's own lines leave
// for the egress lines, so that the egress_summary line always fits: 16 KiB, a quarter of a
// smaller limit. The decision lines take it and whatever room the run left.
func egressReserve(limit int64) int64 { return min(16<<10, limit/4) }

// reserve is egressReserve, or nothing without egress.
func (je *jobEgress) reserve(limit int64) int64 {
	if je == nil {
		return 0
	}
	return egressReserve(limit)
}

// egressSummaryLine is the transcript's last line with egress: the proxy's summary, its hosts
// cut to fit (HostsDropped; the manifest has the first provenance.MaxEgressHosts), and how
// many decision lines were left out.
type egressSummaryLine struct {
	Type string `json:"type"`
	Time string `json:"time"`
	egress.Summary
	HostsDropped int `json:"hosts_dropped,omitempty"`
	DroppedLines int `json:"dropped_lines,omitempty"`
}

// end stops the proxy, appends its decisions to the transcript sp, as data: one "egress"
// line each, then one "egress_summary" line, and returns the summary for the manifest (nil
// without egress). The transcript stays within limit (max_transcript_bytes): the summary line
// first has its hosts cut to fit egressReserve, and decision lines that would pass the limit
// before it are left out, counted in its dropped_lines.
func (je *jobEgress) end(log *slog.Logger, sp *spool, limit int64) *provenance.Egress {
	if je == nil {
		return nil
	}
	je.stop()
	je.mu.Lock()
	defer je.mu.Unlock()
	// The summary as long as it can be: every decision line counted as left out.
	sum := egressSummaryLine{Type: "egress_summary", Time: time.Now().UTC().Format(time.RFC3339Nano), Summary: je.proxy.Summary(),
		DroppedLines: je.dropped + len(je.decisions)}
	summary := fitSummary(&sum, egressReserve(limit))
	room := limit - sp.size - int64(len(summary))
	var errs []error
	for i, d := range je.decisions {
		line, err := json.Marshal(struct {
			Type string `json:"type"`
			egress.Decision
		}{"egress", d})
		if err == nil && int64(len(line))+1 > room {
			break
		}
		room -= int64(len(line)) + 1
		errs = append(errs, writeRaw(sp, line, err))
		sum.DroppedLines = je.dropped + len(je.decisions) - i - 1
	}
	if summary != nil {
		errs = append(errs, writeLine(sp, sum))
	}
	if err := errors.Join(errs...); err != nil {
		log.Warn("egress decisions not all in the transcript", "error", err)
	}
	return je.manifest()
}

// fitSummary cuts sum's hosts until its line fits in n bytes, and returns the line; nil when
// not even one without hosts fits (a max_transcript_bytes of a few hundred bytes).
func fitSummary(sum *egressSummaryLine, n int64) []byte {
	hosts := sum.Hosts
	line := func(keep int) []byte {
		sum.Hosts, sum.HostsDropped = hosts[:keep], len(hosts)-keep
		b, _ := json.Marshal(sum)
		return append(b, '\n')
	}
	// The most hosts that fit, found by halving: a job may have reached many thousands.
	keep := sort.Search(len(hosts)+1, func(k int) bool { return int64(len(line(k))) > n }) - 1
	if keep < 0 {
		return nil
	}
	return line(keep)
}

// writeRaw writes one marshalled line, or marshalErr.
func writeRaw(s *spool, line []byte, marshalErr error) error {
	if marshalErr != nil {
		return marshalErr
	}
	_, err := s.Write(append(line, '\n'))
	return err
}

func writeLine(s *spool, v any) error {
	line, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = s.Write(append(line, '\n'))
	return err
}

// manifest is the summary of what the job's network carried, for the manifest.
func (je *jobEgress) manifest() *provenance.Egress {
	s := je.proxy.Summary()
	m := &provenance.Egress{Requests: s.Requests, Denied: s.Denied, BytesOut: s.BytesOut, BytesIn: s.BytesIn, SecretsUsed: s.Secrets, ClosedUnread: s.ClosedUnread}
	for _, h := range s.Hosts {
		m.Hosts = append(m.Hosts, provenance.EgressHost{Host: h.Host, Requests: h.Requests, BytesOut: h.BytesOut, BytesIn: h.BytesIn})
	}
	return m
}
