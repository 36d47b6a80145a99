package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

const warmJobs = 20

// BenchmarkWarm is row 17 of make bench: from a job asking for its sandbox to the result of
// its first command, each job with its own input file, environment and a placeholder secret
// in that environment, on warm pods (started ahead as a pool's, Running, untimed; then
// claimed: a ping of the session, the patch of labels, annotations and deadline beside the
// job's first steps; without a session, the patch) against cold pods (Start), 20 of
// each per iteration, alternating at a steady rate of one job at a time. Warm pods come two
// ways in the same run: with the bridge (the release image, make image), whose command session
// opened while warm carries the input's write and the command (warm-*), and without it, each
// call a pods/exec of its own (warm-exec-*). A third kind is a job with egress, as a job with
// its own secrets has (warm-egress-*, egressJob): the warm pod claimed, its proxy made and
// attached (the CA and the tunnel over the session), its input written, and a first command
// that reaches an API in the test's network namespace through the proxy with its placeholder;
// with BOXCAR_BENCH_OLD_BRIDGE, the same on an older bridge whose tunnel is a pods/exec of its
// own (warm-egress-old-*). p50 and p99 of each. Pods are closed untimed.
func BenchmarkWarm(b *testing.B) {
	ctx := context.Background()
	ns := benchNamespace(b)
	release, _ := importReleaseImage(b)
	session, plain := newProvider(b, ns, "bench", withBridge(release)), newProvider(b, ns, "bench")
	// first runs the job's first steps and returns how long its input's write took.
	first := func(sb sandbox.Sandbox, id string) time.Duration {
		begin := time.Now()
		if err := sb.WriteFile(ctx, "input.csv", []byte("a,b\n1,"+id+"\n")); err != nil {
			b.Fatal(err)
		}
		wrote := time.Since(begin)
		res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", `test "$JOB" = "$1" && cat input.csv`, "sh", id},
			Env: map[string]string{"JOB": id, "API_TOKEN": "boxcar-placeholder-" + id}, Timeout: time.Minute})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("first command of %s: %v, exit %d: %s", id, err, res.ExitCode, res.Stderr)
		}
		return wrote
	}
	spec := func(id string) sandbox.Spec { return sandboxtest.Spec(id, config.SandboxSpec{CPU: "250m"}) }
	cold := func(i int) time.Duration {
		id := fmt.Sprintf("cold-%d", i)
		begin := time.Now()
		sb, err := plain.Start(ctx, spec(id))
		if err != nil {
			b.Fatalf("Start: %v", err)
		}
		first(sb, id)
		d := time.Since(begin)
		_ = sb.Close(ctx)
		return d
	}
	var steps warmSteps // the claim's steps apart, on the session's pods
	warmSession, warmExec := warmPods(b, session, spec, first, &steps), warmPods(b, plain, spec, first, nil)
	cold(-1)
	warmSession(-1)
	warmExec(-1)
	egressJobs := egressKinds(b, ns, release, spec)
	var tCold, tWarm, tWarmExec []time.Duration
	b.ResetTimer()
	for range b.N {
		for i := range warmJobs {
			tWarm, tWarmExec, tCold = append(tWarm, warmSession(i)), append(tWarmExec, warmExec(i)), append(tCold, cold(i))
			for _, k := range egressJobs {
				k.times = append(k.times, k.job(i))
			}
		}
	}
	b.StopTimer()
	q := func(d []time.Duration, f float64) float64 {
		s := slices.Clone(d)
		slices.Sort(s)
		return float64(s[min(int(f*float64(len(s))), len(s)-1)]) / 1e6
	}
	b.ReportMetric(q(tWarm, 0.5), "warm-p50-ms")
	b.ReportMetric(q(tWarm, 0.99), "warm-p99-ms")
	b.ReportMetric(q(tWarmExec, 0.5), "warm-exec-p50-ms")
	b.ReportMetric(q(tWarmExec, 0.99), "warm-exec-p99-ms")
	b.ReportMetric(q(steps.claim[1:], 0.5), "warm-claim-p50-ms")
	b.ReportMetric(q(steps.write[1:], 0.5), "warm-write-p50-ms")
	b.ReportMetric(q(steps.command[1:], 0.5), "warm-cmd-p50-ms")
	b.ReportMetric(q(tCold, 0.5), "cold-p50-ms")
	b.ReportMetric(q(tCold, 0.99), "cold-p99-ms")
	for _, k := range egressJobs {
		k.report(b, q)
	}
}

// warmSteps are a warm job's steps timed apart: the claim (with the session: its ping, the
// patch running beside the next steps; without: the patch), AttachEgress (an egress job's),
// the input's write and the first command; again is an egress job's first command run a second
// time, untimed in the job's figure (what the command costs in the pod when nothing of the
// claim is on its path). after, when set by the job's first steps, runs once they are timed,
// before the pod is closed.
type warmSteps struct {
	claim, attach, write, command, curl []time.Duration
	after                               func()
}

// warmPods returns a timed warm job on p's pods: the next warm pod starts while the current
// job runs, as a pool keeps one ready; the claim and the first command are timed. The pod
// left ready is closed when the benchmark ends. steps, when not nil, gets each step's time.
func warmPods(b *testing.B, p *sandbox.KubernetesProvider, spec func(string) sandbox.Spec, first func(sandbox.Sandbox, string) time.Duration, steps *warmSteps) func(int) time.Duration {
	ctx := context.Background()
	ahead := func() <-chan sandbox.Sandbox {
		ch := make(chan sandbox.Sandbox, 1)
		go func() {
			s := spec("")
			s.Pool, s.Ahead = "bench", 10*time.Minute
			sb, err := p.Start(ctx, s)
			if err != nil {
				b.Errorf("start a warm pod: %v", err)
				close(ch)
				return
			}
			ch <- sb
		}()
		return ch
	}
	next := ahead()
	b.Cleanup(func() {
		if sb, ok := <-next; ok {
			_ = sb.Close(ctx)
		}
	})
	return func(i int) time.Duration {
		sb, ok := <-next
		if !ok {
			b.FailNow()
		}
		next = ahead()
		id := fmt.Sprintf("warm-%d", i)
		begin := time.Now()
		if err := sb.(sandbox.Claimer).Claim(ctx, "default", id); err != nil {
			b.Fatalf("Claim: %v", err)
		}
		claimed := time.Since(begin)
		wrote := first(sb, id)
		d := time.Since(begin)
		if steps != nil {
			steps.claim = append(steps.claim, claimed)
			steps.write = append(steps.write, wrote)
			steps.command = append(steps.command, d-claimed-wrote)
			if steps.after != nil {
				steps.after()
				steps.after = nil
			}
		}
		_ = sb.Close(ctx)
		return d
	}
}
