package sandbox

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestUsageCountsFromClaim: a claimed warm sandbox's cgroup counts from its claim, on fake
// cgroup files: the CPU counter less its value then, and the peak reset at the claim (cgroup
// v1 for every reader, v2 through the descriptor that reset it) less the memory in use then.
// The files the test writes after the claim are what the kernel would show by then.
func TestUsageCountsFromClaim(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		atClaim, later map[string]string
		resetFile      string // the file the claim resets, and what it then holds
		resetTo        string
		want           Usage
	}{
		{
			name:      "cgroup v2",
			atClaim:   map[string]string{"cpu.stat": "usage_usec 7000\nuser_usec 5000\n", "memory.peak": "5000\n", "memory.current": "3000\n"},
			later:     map[string]string{"cpu.stat": "usage_usec 19000\n", "memory.peak": "45000\n", "memory.current": "4000\n"},
			resetFile: "memory.peak", resetTo: "reset\n",
			want: Usage{CPUMillis: 12, PeakMemoryBytes: 42000, Source: "cgroup v2"},
		},
		{
			name:      "cgroup v1",
			atClaim:   map[string]string{"cpuacct.usage": "5000000\n", "memory.max_usage_in_bytes": "1044480\n", "memory.usage_in_bytes": "1015808\n"},
			later:     map[string]string{"cpuacct.usage": "25000000\n", "memory.max_usage_in_bytes": "31015808\n"},
			resetFile: "memory.max_usage_in_bytes", resetTo: "0",
			want: Usage{CPUMillis: 20, PeakMemoryBytes: 30_000_000, Source: "cgroup v1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			write := func(files map[string]string) {
				for name, data := range files {
					if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			write(tt.atClaim)
			cg := &cgroup{dirs: []string{dir}}
			cg.countFromClaim()
			t.Cleanup(cg.closeBase)
			if data, _ := os.ReadFile(filepath.Join(dir, tt.resetFile)); !strings.HasPrefix(string(data), tt.resetTo) {
				t.Errorf("the claim left %s holding %q, want %q written to reset the peak", tt.resetFile, data, tt.resetTo)
			}
			write(tt.later)
			if got := cg.usage(); got.CPUMillis != tt.want.CPUMillis || got.PeakMemoryBytes != tt.want.PeakMemoryBytes || got.Source != tt.want.Source || len(got.Missing) != 0 {
				t.Errorf("usage = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestUsagePeakNotResettable: where the claim could not reset the peak (cgroup v2 before Linux
// 6.12), a peak not above the one at the claim may be the spare's before it, and Usage says
// so; one above it is the job's.
func TestUsagePeakNotResettable(t *testing.T) {
	t.Parallel()
	note := func(u Usage) bool {
		return slices.ContainsFunc(u.Missing, func(m string) bool { return strings.HasPrefix(m, "memory: the peak may be") })
	}
	base := usageBase{cpuMillis: 3, memBytes: 1000, peakBytes: 1500}
	u := Usage{CPUMillis: 4, PeakMemoryBytes: 1500}
	base.subtract(&u)
	if u.CPUMillis != 1 || u.PeakMemoryBytes != 500 || !note(u) {
		t.Errorf("peak not above the claim's: %+v, want cpu 1, peak 500, and the note", u)
	}
	u = Usage{CPUMillis: 4, PeakMemoryBytes: 9000}
	base.subtract(&u)
	if u.PeakMemoryBytes != 8000 || note(u) {
		t.Errorf("peak above the claim's: %+v, want 8000 and no note", u)
	}
	u = Usage{Missing: []string{"memory: no memory controller"}}
	base.subtract(&u)
	if note(u) || u.PeakMemoryBytes != 0 {
		t.Errorf("memory not counted: %+v, want no note and no figure", u)
	}
}
