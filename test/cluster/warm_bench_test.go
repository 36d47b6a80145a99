package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
	"github.com/boxcar-run/boxcar/test/cluster"
)

const warmJobs = 20

// BenchmarkWarm is row 17 of make bench: from a job asking for its sandbox to the result of
// its first command, each job with its own input file, environment and a placeholder secret
// in that environment, on warm pods (started ahead as a pool's, Running, untimed; then
// claimed: one patch of labels, annotations and deadline) against cold pods (Start), 20 of
// each per iteration, alternating at a steady rate of one job at a time. p50 and p99 of each.
// Pods are closed untimed.
func BenchmarkWarm(b *testing.B) {
	ctx := context.Background()
	ns := benchNamespace(b)
	p, err := sandbox.NewKubernetes(sandbox.KubernetesConfig{
		Client: kube.Client, RESTConfig: kube.RESTConfig, Namespace: ns,
		Image: cluster.SandboxImage, ImagePullPolicy: corev1.PullNever,
		WorkerID: "bench", StartTimeout: 2 * time.Minute,
	})
	if err != nil {
		b.Fatalf("NewKubernetes: %v", err)
	}
	first := func(sb sandbox.Sandbox, id string) {
		if err := sb.WriteFile(ctx, "input.csv", []byte("a,b\n1,"+id+"\n")); err != nil {
			b.Fatal(err)
		}
		res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", `test "$JOB" = "$1" && cat input.csv`, "sh", id},
			Env: map[string]string{"JOB": id, "API_TOKEN": "boxcar-placeholder-" + id}, Timeout: time.Minute})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("first command of %s: %v, exit %d: %s", id, err, res.ExitCode, res.Stderr)
		}
	}
	spec := func(id string) sandbox.Spec { return sandboxtest.Spec(id, config.SandboxSpec{}) }
	cold := func(i int) time.Duration {
		id := fmt.Sprintf("cold-%d", i)
		begin := time.Now()
		sb, err := p.Start(ctx, spec(id))
		if err != nil {
			b.Fatalf("Start: %v", err)
		}
		first(sb, id)
		d := time.Since(begin)
		_ = sb.Close(ctx)
		return d
	}
	// The next warm pod starts while the current job runs, as a pool keeps one ready.
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
	warm := func(i int) time.Duration {
		sb, ok := <-next
		if !ok {
			b.FailNow()
		}
		next = ahead()
		id := fmt.Sprintf("warm-%d", i)
		begin := time.Now()
		if err := sb.(sandbox.Claimer).Claim(ctx, id); err != nil {
			b.Fatalf("Claim: %v", err)
		}
		first(sb, id)
		d := time.Since(begin)
		_ = sb.Close(ctx)
		return d
	}
	cold(-1)
	warm(-1)
	var tCold, tWarm []time.Duration
	b.ResetTimer()
	for range b.N {
		for i := range warmJobs {
			tWarm, tCold = append(tWarm, warm(i)), append(tCold, cold(i))
		}
	}
	b.StopTimer()
	if sb, ok := <-next; ok {
		_ = sb.Close(ctx)
	}
	q := func(d []time.Duration, f float64) float64 {
		s := slices.Clone(d)
		slices.Sort(s)
		return float64(s[min(int(f*float64(len(s))), len(s)-1)]) / 1e6
	}
	b.ReportMetric(q(tWarm, 0.5), "warm-p50-ms")
	b.ReportMetric(q(tWarm, 0.99), "warm-p99-ms")
	b.ReportMetric(q(tCold, 0.5), "cold-p50-ms")
	b.ReportMetric(q(tCold, 0.99), "cold-p99-ms")
}
