//go:build integration

package sandbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// TestAuditPoolWarmUsageIsTheJobsAlone: the manifest's usage.sandbox (cpu_ms,
// peak_memory_bytes) is "what the committing attempt used, for accounting" (docs/provenance.md),
// and a warm sandbox is to be indistinguishable from a cold one in the manifest but for warm
// and claimed_at. A claimed warm sandbox that has run nothing for its job yet must count what
// a cold one that has run nothing counts; it counts its spare bwrap, which the worker started
// before the job existed (and, with egress, the spare it replaced).
func TestAuditPoolWarmUsageIsTheJobsAlone(t *testing.T) {
	t.Parallel()
	for _, goSpare := range []bool{false, true} {
		name := map[bool]string{false: "shell spare", true: "Go spare"}[goSpare]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := sandboxtest.Bubblewrap(t)
			if goSpare {
				sandbox.UseGoSpare(p)
			}
			cold := sandboxtest.StartSpec(t, p, config.SandboxSpec{})
			cu, ok := cold.(usageOf).Usage()
			if !ok {
				t.Skipf("no cgroup here: %+v", cu)
			}
			spec := sandboxtest.Spec("", config.SandboxSpec{})
			spec.Pool, spec.Ahead = "p", time.Hour
			warm, err := p.Start(t.Context(), spec)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = warm.Close(context.Background()) })
			sandbox.AwaitWarm(warm)
			if err := warm.(sandbox.Claimer).Claim(t.Context(), "job-1"); err != nil {
				t.Fatal(err)
			}
			wu, _ := warm.(usageOf).Usage()
			t.Logf("cold before any command: %+v; warm just claimed: %+v", cu, wu)
			if wu.CPUMillis != cu.CPUMillis || wu.PeakMemoryBytes != cu.PeakMemoryBytes {
				t.Errorf("a just-claimed warm sandbox counts cpu %d ms, peak memory %d bytes for its job; a cold one %d ms, %d bytes",
					wu.CPUMillis, wu.PeakMemoryBytes, cu.CPUMillis, cu.PeakMemoryBytes)
			}
		})
	}
}
