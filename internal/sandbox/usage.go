package sandbox

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Usage is what a sandbox's processes used so far, as its cgroup counted it. A field the host
// cannot count is zero, and Missing names it.
type Usage struct {
	// CPUMillis is the CPU time of every process the sandbox ran, user and system, in
	// milliseconds.
	CPUMillis int64
	// PeakMemoryBytes is the most memory the sandbox's processes held at once.
	PeakMemoryBytes int64
	// Source says where the figures come from, e.g. "cgroup v1" or "cgroup v2".
	Source string
	// Missing names what could not be counted and why, e.g. "cpu: no cpuacct controller".
	Missing []string
}

var _ UsageCounter = (*bubblewrapSandbox)(nil)

// Usage reads the sandbox's cgroup; false when the sandbox has none (the host gave the worker
// no writable cgroup hierarchy, or cgroups are disabled), which Missing then says.
func (s *bubblewrapSandbox) Usage() (Usage, bool) {
	if s.cg == nil || len(s.cg.dirs) == 0 {
		return Usage{Missing: []string{"cpu, memory: the sandbox has no cgroup (isolation " + s.info.Isolation + ")"}}, false
	}
	return s.cg.usage(), true
}

// usage reads CPU time and peak memory from whichever of the cgroup's folders has them:
// cpu.stat's usage_usec (v2) or cpuacct.usage (v1, where cpuacct is mounted with cpu), and
// memory.peak (v2, Linux 5.19 or later) or memory.max_usage_in_bytes (v1).
func (c *cgroup) usage() Usage {
	u := Usage{Source: "cgroup"}
	cpu, mem := false, false
	for _, dir := range c.dirs {
		if v, ok := statField(filepath.Join(dir, "cpu.stat"), "usage_usec"); ok && !cpu {
			u.CPUMillis, cpu, u.Source = v/1000, true, "cgroup v2"
		}
		if v, ok := readInt(filepath.Join(dir, "cpuacct.usage")); ok && !cpu {
			u.CPUMillis, cpu, u.Source = v/1_000_000, true, "cgroup v1"
		}
		for f, source := range map[string]string{"memory.peak": "cgroup v2", "memory.max_usage_in_bytes": "cgroup v1"} {
			if v, ok := readInt(filepath.Join(dir, f)); ok && !mem {
				u.PeakMemoryBytes, mem, u.Source = v, true, source
			}
		}
	}
	if !cpu {
		u.Missing = append(u.Missing, "cpu: the sandbox's cgroup has no cpu.stat or cpuacct.usage (cgroup v1 without cpuacct mounted with cpu)")
	}
	if !mem {
		u.Missing = append(u.Missing, "memory: the sandbox's cgroup has no memory.peak or memory.max_usage_in_bytes (no memory controller, or Linux before 5.19 on cgroup v2)")
	}
	return u
}

func readInt(path string) (int64, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return v, err == nil
}

// statField reads one "key value" line of a cgroup stat file.
func statField(path, key string) (int64, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
