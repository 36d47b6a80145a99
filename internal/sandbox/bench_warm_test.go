//go:build integration

package sandbox_test

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// BenchmarkBubblewrapWarmStart is row 14: from asking for a sandbox to its first command, with
// a warm sandbox (started ahead as a pool's, untimed, then claimed) against a cold one (Start),
// alternating, one of each per iteration. The command is `date +%s%N`: "run" is until it runs
// (the time it prints), "result" until Exec returns its result, which adds the command's exit
// and the teardown of its namespaces (the same for both). Both are closed untimed. The floor
// is the same command started by the worker itself, without a sandbox (fork, exec, the
// dynamic loader and date's own start): no sandbox can start its command sooner, and
// warm-over-floor-ms is what the warm sandbox adds to it.
func BenchmarkBubblewrapWarmStart(b *testing.B) {
	p := sandboxtest.Bubblewrap(b)
	ctx := context.Background()
	spec := sandboxtest.Spec("bench", config.SandboxSpec{})
	req := sandbox.ExecRequest{Argv: []string{"date", "+%s%N"}, Timeout: 30 * time.Second}
	first := func(sb sandbox.Sandbox, begin time.Time) (run, result time.Duration) {
		res, err := sb.Exec(ctx, req)
		result = time.Since(begin)
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec date: %v, exit %d, stderr %q", err, res.ExitCode, res.Stderr)
		}
		ns, err := strconv.ParseInt(strings.TrimSpace(string(res.Stdout)), 10, 64)
		if err != nil {
			b.Fatalf("date printed %q", res.Stdout)
		}
		if err := sb.Close(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Unix(0, ns).Sub(begin), result
	}
	cold := func() (time.Duration, time.Duration) {
		begin := time.Now()
		sb, err := p.Start(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		return first(sb, begin)
	}
	warm := func() (time.Duration, time.Duration) {
		ahead := spec
		ahead.JobID, ahead.Pool, ahead.Ahead = "", "bench", time.Hour
		sb, err := p.Start(ctx, ahead)
		if err != nil {
			b.Fatal(err)
		}
		sandbox.AwaitWarm(sb) // what a pool's sandbox has done by the time a job claims it
		begin := time.Now()
		if err := sb.(sandbox.Claimer).Claim(ctx, "default", "bench"); err != nil {
			b.Fatal(err)
		}
		return first(sb, begin)
	}
	floor := func() time.Duration {
		cmd := exec.Command("date", "+%s%N")
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + b.TempDir(), "LANG=C.UTF-8"} // as a sandbox's command has them
		begin := time.Now()
		out, err := cmd.Output()
		if err != nil {
			b.Fatal(err)
		}
		ns, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
		if err != nil {
			b.Fatalf("date printed %q", out)
		}
		return time.Unix(0, ns).Sub(begin)
	}
	cold()
	warm()
	var coldRun, coldRes, warmRun, warmRes, floorRun []time.Duration
	b.ResetTimer()
	for range b.N {
		r, s := warm()
		warmRun, warmRes = append(warmRun, r), append(warmRes, s)
		r, s = cold()
		coldRun, coldRes = append(coldRun, r), append(coldRes, s)
		floorRun = append(floorRun, floor())
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	b.ReportMetric(ms(median(warmRun)), "warm-run-ms")
	b.ReportMetric(ms(percentile(warmRun, 99)), "warm-run-p99-ms")
	b.ReportMetric(ms(median(coldRun)), "cold-run-ms")
	b.ReportMetric(ms(median(warmRes)), "warm-result-ms")
	b.ReportMetric(ms(median(coldRes)), "cold-result-ms")
	b.ReportMetric(float64(median(warmRun))/float64(median(coldRun)), "run-x-of-cold")
	b.ReportMetric(ms(median(floorRun)), "floor-run-ms")
	b.ReportMetric(ms(median(warmRun)-median(floorRun)), "warm-over-floor-ms")
}

func percentile(d []time.Duration, pc int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*pc/100)]
}
