package sandbox_test

import (
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// TestBubblewrapUsage: a real bubblewrap sandbox counts the CPU time and peak memory of the
// commands it ran in its cgroup; without a cgroup (cgroups disabled) it says what it cannot
// count instead of reporting zeros as figures.
func TestBubblewrapUsage(t *testing.T) {
	const burn = `i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; x=$(head -c 30000000 /dev/zero | tr '\0' a); echo ${#x}`
	tests := []struct {
		name    string
		noCg    bool
		counted bool
	}{
		{name: "cgroup", counted: true},
		{name: "cgroups disabled", noCg: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := sandboxtest.Bubblewrap(t, func(c *sandbox.BubblewrapConfig) { c.DisableCgroups = tt.noCg })
			sb := sandboxtest.StartSpec(t, p, config.SandboxSpec{Memory: "256Mi"})
			res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sh", "-c", burn}})
			if err != nil || res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != "30000000" {
				t.Fatalf("exec: %v, exit %d, %q %q", err, res.ExitCode, res.Stdout, res.Stderr)
			}
			u, ok := sb.(sandbox.UsageCounter).Usage()
			if ok != tt.counted {
				t.Fatalf("Usage() = %+v, %v; want counted %v (isolation %s)", u, ok, tt.counted, sb.Info().Isolation)
			}
			if !ok {
				if len(u.Missing) == 0 || u.CPUMillis != 0 || u.PeakMemoryBytes != 0 {
					t.Errorf("Usage() = %+v; want no figures and what is missing", u)
				}
				return
			}
			t.Logf("usage: %+v", u)
			if u.Source != "cgroup v1" && u.Source != "cgroup v2" {
				t.Errorf("source %q, want the cgroup version", u.Source)
			}
			if u.PeakMemoryBytes < 30_000_000 && !missing(u, "memory") {
				t.Errorf("peak memory %d bytes, want at least the 30 MB the shell held", u.PeakMemoryBytes)
			}
			if u.CPUMillis <= 0 && !missing(u, "cpu") {
				t.Errorf("cpu %d ms, want some", u.CPUMillis)
			}
		})
	}
}

func missing(u sandbox.Usage, what string) bool {
	for _, m := range u.Missing {
		if strings.HasPrefix(m, what+":") {
			return true
		}
	}
	return false
}
