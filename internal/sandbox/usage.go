package sandbox

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
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
// memory.peak (v2, Linux 5.19 or later) or memory.max_usage_in_bytes (v1). A claimed warm
// sandbox's count starts at its claim (countFromClaim).
func (c *cgroup) usage() Usage {
	c.mu.Lock()
	defer c.mu.Unlock()
	u := c.read()
	if c.base != nil {
		c.base.subtract(&u)
	}
	return u
}

// read is usage as the cgroup's files have it, but for a peak reset through a descriptor of
// its own, read through that. The caller holds mu.
func (c *cgroup) read() Usage {
	u := Usage{Source: "cgroup"}
	cpu, mem := false, false
	if c.base != nil && c.base.peakFile != nil {
		if v, ok := readIntAt(c.base.peakFile); ok {
			u.PeakMemoryBytes, mem, u.Source = v, true, "cgroup v2"
		}
	}
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

// usageBase is what a warm sandbox's cgroup had counted when its job claimed it: its spare
// process (bubblewrap_spare.go), started before the job existed, is the pool's and not the
// job's, so the job's usage counts from its claim, and over the memory held then.
type usageBase struct {
	cpuMillis int64
	memBytes  int64 // in use at the claim
	peakBytes int64 // the peak at the claim, which a peak that could not be reset may still be
	reset     bool  // the peak was reset to the memory in use at the claim
	// peakFile is cgroup v2's memory.peak, reset through this descriptor (Linux 6.12 or
	// later), which alone reads the peak since.
	peakFile *os.File
}

// countFromClaim makes the cgroup count from now: CPU time from its counter now, and memory
// over what is in use now, the peak reset to it where the kernel can (cgroup v1's
// memory.max_usage_in_bytes; v2's memory.peak since Linux 6.12). Where it cannot, the peak
// read later is the job's only once it is above the one at the claim; Usage says so until then.
func (c *cgroup) countFromClaim() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeBaseLocked()
	u := c.read()
	b := &usageBase{cpuMillis: u.CPUMillis, peakBytes: u.PeakMemoryBytes}
	for _, dir := range c.dirs {
		for _, f := range []string{"memory.current", "memory.usage_in_bytes"} {
			if v, ok := readInt(filepath.Join(dir, f)); ok && b.memBytes == 0 {
				b.memBytes = v
			}
		}
	}
	b.peakFile, b.reset = c.resetPeak()
	c.base = b
}

// resetPeak sets the cgroup's peak memory to the memory in use now: on cgroup v1 for every
// reader, on v2 for reads through the returned descriptor alone.
func (c *cgroup) resetPeak() (*os.File, bool) {
	for _, dir := range c.dirs {
		if f, err := os.OpenFile(filepath.Join(dir, "memory.max_usage_in_bytes"), os.O_WRONLY|os.O_TRUNC, 0); err == nil {
			_, err = f.WriteString("0")
			if cerr := f.Close(); err == nil && cerr == nil {
				return nil, true
			}
		}
		if f, err := os.OpenFile(filepath.Join(dir, "memory.peak"), os.O_RDWR, 0); err == nil {
			if _, err := f.WriteString("reset\n"); err == nil {
				return f, true
			}
			_ = f.Close()
		}
	}
	return nil, false
}

// subtract takes the claim's counts off u.
func (b *usageBase) subtract(u *Usage) {
	memCounted := !slices.ContainsFunc(u.Missing, func(m string) bool { return strings.HasPrefix(m, "memory:") })
	if memCounted && !b.reset && u.PeakMemoryBytes <= b.peakBytes {
		u.Missing = append(u.Missing, "memory: the peak may be the warm sandbox's before its claim: its cgroup's peak cannot be reset (cgroup v2 before Linux 6.12), and its job has not passed it")
	}
	u.CPUMillis = max(u.CPUMillis-b.cpuMillis, 0)
	u.PeakMemoryBytes = max(u.PeakMemoryBytes-b.memBytes, 0)
}

// closeBase lets go of the claim's descriptor, when the cgroup goes.
func (c *cgroup) closeBase() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeBaseLocked()
}

func (c *cgroup) closeBaseLocked() {
	if c.base != nil && c.base.peakFile != nil {
		_ = c.base.peakFile.Close()
		c.base.peakFile = nil
	}
}

// readIntAt reads a one-number file from its start through f.
func readIntAt(f *os.File) (int64, bool) {
	buf := make([]byte, 32)
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(buf[:n])), 10, 64)
	return v, err == nil
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
