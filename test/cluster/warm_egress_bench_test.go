package cluster_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/egress"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/testnet"
)

// oldBridgeEnv names a folder holding a worker image built before egress went over the command
// session (its image.tar and image.ref, as make image writes them in bin/): set, BenchmarkWarm
// also times egress jobs on warm pods whose bridge is that image, whose session does not know
// the request, so that the tunnel takes a pods/exec of its own: the baseline, in the same run.
const oldBridgeEnv = "BOXCAR_BENCH_OLD_BRIDGE"

// egressJob is row 17's job with egress, as a job with its own secrets has: its own proxy (its
// CA, and a placeholder for its token bound to apiHost), attached to the warm pod once claimed,
// the same first command as the other kinds (what is timed is how soon a job's command runs,
// not the command), and then, timed apart, curl sending the placeholder to the API served in
// a network namespace of the test's, through the proxy, which must swap in the real value.
type egressJob struct {
	cfg    egress.Config
	secret string
	api    *seenAuth
}

func newEgressJob(b *testing.B) *egressJob {
	netns := testnet.NewNetns(b)
	api := &seenAuth{}
	upstreamCA, err := os.ReadFile(serveAPI(b, netns, api, filepath.Join(b.TempDir(), "upstream-ca.pem")))
	if err != nil {
		b.Fatal(err)
	}
	var r [16]byte
	_, _ = rand.Read(r[:])
	return &egressJob{
		cfg: egress.Config{
			Resolver:      oneName{apiHost: netns.Addr},
			AllowedCIDRs:  []netip.Prefix{netip.PrefixFrom(netns.Addr, 32)},
			UpstreamCAPEM: upstreamCA,
			Limits:        egress.Limits{HeaderTimeout: 10 * time.Second},
			Logger:        slog.New(slog.DiscardHandler),
		},
		secret: "realtoken" + hex.EncodeToString(r[:]),
		api:    api,
	}
}

// first is the job's first steps on a claimed pod: its proxy made and attached (timed apart,
// into steps.attach), its input written, its first command through the proxy. It returns the
// time to the input's write, as BenchmarkWarm's first does, so that what follows is the
// command's.
func (j *egressJob) first(b *testing.B, steps *warmSteps) func(sandbox.Sandbox, string) time.Duration {
	return func(sb sandbox.Sandbox, id string) time.Duration {
		ctx := context.Background()
		begin := time.Now()
		proxy, err := egress.New(j.cfg, egress.Policy{Allow: []string{apiHost}, Secrets: []egress.Secret{{Env: "API_TOKEN", Value: j.secret, Hosts: []string{apiHost}}}})
		if err != nil {
			b.Fatalf("egress.New: %v", err)
		}
		ln, err := sb.(sandbox.Egress).AttachEgress(ctx, proxy.CACertPEM())
		if err != nil {
			b.Fatalf("AttachEgress: %v", err)
		}
		steps.attach = append(steps.attach, time.Since(begin))
		sctx, stop := context.WithCancel(ctx)
		served := make(chan struct{})
		go func() { defer close(served); _ = proxy.Serve(sctx, ln) }()
		if err := sb.WriteFile(ctx, "input.csv", []byte("a,b\n1,"+id+"\n")); err != nil {
			b.Fatal(err)
		}
		wrote := time.Since(begin)
		env := map[string]string{"JOB": id}
		for _, kv := range proxy.Env(sandbox.EgressAddr, sandbox.EgressCAFile) {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", `test "$JOB" = "$1" && cat input.csv`, "sh", id},
			Env: env, Timeout: time.Minute})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("first command of %s: %v, exit %d: %s", id, err, res.ExitCode, res.Stderr)
		}
		steps.after = func() {
			curl := time.Now()
			j.curl(b, sb, id, env)
			steps.curl = append(steps.curl, time.Since(curl))
			stop()
			ln.Close()
			<-served
		}
		return wrote
	}
}

// curl sends the placeholder to the API through the proxy, and checks that the API saw the
// real token and the command's output holds none of it.
func (j *egressJob) curl(b *testing.B, sb sandbox.Sandbox, id string, env map[string]string) {
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"sh", "-c",
		`test "$JOB" = "$1" && test -s input.csv && curl -sS --max-time 30 -H "Authorization: Bearer $API_TOKEN" https://` + apiHost + `/`, "sh", id},
		Env: env, Timeout: time.Minute})
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != "api answered\n" {
		b.Fatalf("curl through the proxy of %s: %v, exit %d, stdout %q: %s", id, err, res.ExitCode, res.Stdout, res.Stderr)
	}
	if seen := j.api.all(); len(seen) == 0 || seen[len(seen)-1] != "Bearer "+j.secret {
		b.Fatalf("the API did not see the real token for %s (%d requests)", id, len(seen))
	}
	if bytes.Contains(res.Stdout, []byte(j.secret)) || bytes.Contains(res.Stderr, []byte(j.secret)) {
		b.Fatal("the command's output holds the real token")
	}
}

// oneName resolves the API's name to its namespace's address, and nothing else.
type oneName map[string]netip.Addr

func (r oneName) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[strings.TrimSuffix(host, ".")]; ok {
		return []netip.Addr{a}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// oldBridge imports the image oldBridgeEnv names and returns its reference, or "" when it is
// not set.
func oldBridge(b *testing.B) string {
	dir := os.Getenv(oldBridgeEnv)
	if dir == "" {
		return ""
	}
	ref, err := os.ReadFile(filepath.Join(dir, "image.ref"))
	if err != nil || len(strings.Fields(string(ref))) != 2 {
		b.Fatalf("%s=%s: want image.ref (IMAGE VERSION) and image.tar there, as make image writes them: %v", oldBridgeEnv, dir, err)
	}
	if err := kube.ImportArchive(b.Context(), filepath.Join(dir, "image.tar")); err != nil {
		b.Fatal(err)
	}
	return strings.Fields(string(ref))[0]
}

// egressKind is one kind of BenchmarkWarm's warm egress jobs: on the release image's bridge,
// or (with oldBridgeEnv) on an older one.
type egressKind struct {
	name  string
	job   func(int) time.Duration
	steps warmSteps
	times []time.Duration
}

// egressKinds starts the warm egress jobs' pools: the tools image (curl) as the sandbox image.
func egressKinds(b *testing.B, ns, release string, spec func(string) sandbox.Spec) []*egressKind {
	importToolsImage(b)
	job := newEgressJob(b)
	kinds := []*egressKind{{name: "warm-egress"}}
	bridges := []string{release}
	if old := oldBridge(b); old != "" {
		kinds, bridges = append(kinds, &egressKind{name: "warm-egress-old"}), append(bridges, old)
	}
	for i, k := range kinds {
		p := newProvider(b, ns, "bench", withBridge(bridges[i]), func(c *sandbox.KubernetesConfig) { c.Image = toolsImage })
		k.job = warmPods(b, p, spec, job.first(b, &k.steps), &k.steps)
		k.job(-1) // warm up, untimed: the first pod of the tools image
		k.steps = warmSteps{}
	}
	return kinds
}

// report reports the kind's p50 and p99, and the p50 of its claim, AttachEgress, first
// command, and curl through the proxy after it.
func (k *egressKind) report(b *testing.B, q func([]time.Duration, float64) float64) {
	b.ReportMetric(q(k.times, 0.5), k.name+"-p50-ms")
	b.ReportMetric(q(k.times, 0.99), k.name+"-p99-ms")
	b.ReportMetric(q(k.steps.claim, 0.5), k.name+"-claim-p50-ms")
	b.ReportMetric(q(k.steps.attach, 0.5), k.name+"-attach-p50-ms")
	b.ReportMetric(q(k.steps.command, 0.5), k.name+"-cmd-p50-ms")
	b.ReportMetric(q(k.steps.curl, 0.5), k.name+"-curl-p50-ms")
}
