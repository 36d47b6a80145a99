package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
)

// Cgroup controllers a sandbox uses.
const (
	ctlMemory = "memory"
	ctlPIDs   = "pids"
	ctlCPU    = "cpu"
)

// cpuPeriod is the CFS period quotas are expressed in, in microseconds.
const cpuPeriod = 100_000

// The bounds of the waits between attempts to remove a sandbox's cgroup.
const (
	removeRetryMin = 250 * time.Microsecond
	removeRetryMax = 10 * time.Millisecond
)

// cgroupHost says where this worker may make cgroups: for each controller, the folder of the
// worker's own cgroup in a writable hierarchy. Sandboxes become children of the worker's cgroup,
// so whatever bounds the worker (a container, a systemd unit) bounds them too.
type cgroupHost struct {
	version int               // 1 or 2; 0 when no controller is usable
	parent  map[string]string // controller → folder; in v2 every controller shares one folder
}

// controllers lists the controllers in force, in a fixed order.
func (h cgroupHost) controllers() []string {
	var out []string
	for _, c := range []string{ctlMemory, ctlPIDs, ctlCPU} {
		if h.parent[c] != "" {
			out = append(out, c)
		}
	}
	return out
}

// findCgroups looks for writable memory, pids and cpu controllers: cgroup v1 hierarchies first
// (the hybrid layout mounts an empty v2 tree next to them), else the v2 tree when the worker's
// cgroup delegates those controllers to its children. Probing makes and removes a child cgroup,
// which is the only reliable test of write access.
func findCgroups() cgroupHost {
	v1, v2Mount, v2Root, err := cgroupMounts()
	if err != nil {
		return cgroupHost{}
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return cgroupHost{}
	}
	v1Paths, v2Path := parseProcCgroup(own)

	h := cgroupHost{version: 1, parent: map[string]string{}}
	for _, c := range []string{ctlMemory, ctlPIDs, ctlCPU} {
		m, ok := v1[c]
		p, okp := v1Paths[c]
		if !ok || !okp {
			continue
		}
		dir := filepath.Join(m.mountpoint, relCgroup(p, m.root))
		if probeCgroup(dir, limitFile(1, c)) == nil {
			h.parent[c] = dir
		}
	}
	if len(h.parent) > 0 {
		return h
	}
	if v2Mount == "" || v2Path == "" {
		return cgroupHost{}
	}
	dir := filepath.Join(v2Mount, relCgroup(v2Path, v2Root))
	h = cgroupHost{version: 2, parent: map[string]string{}}
	enabled, _ := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	for _, c := range []string{ctlMemory, ctlPIDs, ctlCPU} {
		if !slices.Contains(strings.Fields(string(enabled)), c) {
			// Enabling fails while the worker's own cgroup holds processes ("no internal
			// processes"), which is the usual case; a service manager that delegates a
			// subtree enables them for us.
			_ = os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+"+c), 0)
		}
		if probeCgroup(dir, limitFile(2, c)) == nil {
			h.parent[c] = dir
		}
	}
	if len(h.parent) == 0 {
		return cgroupHost{}
	}
	return h
}

type cgroupMount struct{ root, mountpoint string }

// cgroupMounts reads the mount table: v1 controller → mount, and the v2 mount.
func cgroupMounts() (v1 map[string]cgroupMount, v2Mount, v2Root string, err error) {
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil, "", "", err
	}
	v1 = map[string]cgroupMount{}
	for _, m := range mounts {
		switch m.FSType {
		case "cgroup":
			for _, opt := range strings.Split(m.VFSOptions, ",") {
				if _, seen := v1[opt]; !seen {
					v1[opt] = cgroupMount{root: m.Root, mountpoint: m.Mountpoint}
				}
			}
		case "cgroup2":
			if v2Mount == "" {
				v2Mount, v2Root = m.Mountpoint, m.Root
			}
		}
	}
	return v1, v2Mount, v2Root, nil
}

// parseProcCgroup reads /proc/self/cgroup: v1 controller → path, and the v2 path.
func parseProcCgroup(data []byte) (v1 map[string]string, v2 string) {
	v1 = map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2 = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			v1[c] = parts[2]
		}
	}
	return v1, v2
}

// relCgroup is a cgroup path relative to the root of its mount (they differ inside a cgroup
// namespace or a container that mounts only its own subtree).
func relCgroup(p, root string) string {
	if root == "/" || root == "" {
		return p
	}
	if rel, ok := strings.CutPrefix(p, root); ok {
		return rel
	}
	return p
}

func limitFile(version int, controller string) string {
	switch {
	case version == 1 && controller == ctlMemory:
		return "memory.limit_in_bytes"
	case version == 1 && controller == ctlCPU:
		return "cpu.cfs_quota_us"
	case version == 2 && controller == ctlMemory:
		return "memory.max"
	case version == 2 && controller == ctlCPU:
		return "cpu.max"
	}
	return "pids.max"
}

func probeCgroup(parent, file string) error {
	dir := filepath.Join(parent, "boxcar-probe-"+randomHex(4))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	defer os.Remove(dir)
	if _, err := os.Stat(filepath.Join(dir, file)); err != nil {
		return err
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// cgroupLimits are the bounds written into a sandbox's cgroup.
type cgroupLimits struct {
	memory   int64 // bytes
	pids     int
	cpuMilli int64 // thousandths of a core
}

// cgroup is one sandbox's cgroup: one folder per v1 controller, or a single v2 folder.
type cgroup struct {
	dirs        []string
	controllers []string // those whose limits were written

	mu   sync.Mutex
	base *usageBase // what a warm sandbox had counted at its claim (usage.go); nil: nothing
}

// newCgroup makes the sandbox's cgroup and writes its limits. A controller whose limit cannot be
// written is left out (and so reported as not in force) instead of failing the sandbox: rlimits
// still bound it.
func (h cgroupHost) newCgroup(name string, lim cgroupLimits) (*cgroup, []error) {
	cg := &cgroup{}
	var errs []error
	made := map[string]bool{}
	for _, c := range h.controllers() {
		dir := filepath.Join(h.parent[c], name)
		if !made[dir] {
			if err := os.Mkdir(dir, 0o755); err != nil {
				errs = append(errs, fmt.Errorf("cgroup %s: %w", c, err))
				continue
			}
			made[dir] = true
			cg.dirs = append(cg.dirs, dir)
		}
		if err := writeLimit(h.version, c, dir, lim); err != nil {
			errs = append(errs, fmt.Errorf("cgroup %s limit: %w", c, err))
			continue
		}
		cg.controllers = append(cg.controllers, c)
	}
	return cg, errs
}

func writeLimit(version int, controller, dir string, lim cgroupLimits) error {
	write := func(file, value string) error {
		return os.WriteFile(filepath.Join(dir, file), []byte(value), 0)
	}
	mem := strconv.FormatInt(lim.memory, 10)
	quota := lim.cpuMilli * cpuPeriod / 1000
	switch {
	case version == 1 && controller == ctlMemory:
		if err := write("memory.limit_in_bytes", mem); err != nil {
			return err
		}
		// Without this, a host with swap lets the sandbox page out past its limit. The file
		// is absent when swap accounting is off, and then there is nothing to bound.
		if _, err := os.Stat(filepath.Join(dir, "memory.memsw.limit_in_bytes")); err == nil {
			return write("memory.memsw.limit_in_bytes", mem)
		}
		return nil
	case version == 1 && controller == ctlCPU:
		if err := write("cpu.cfs_period_us", strconv.Itoa(cpuPeriod)); err != nil {
			return err
		}
		return write("cpu.cfs_quota_us", strconv.FormatInt(quota, 10))
	case version == 2 && controller == ctlMemory:
		if err := write("memory.max", mem); err != nil {
			return err
		}
		_ = write("memory.swap.max", "0") // absent without swap accounting
		return nil
	case version == 2 && controller == ctlCPU:
		return write("cpu.max", fmt.Sprintf("%d %d", quota, cpuPeriod))
	}
	return write("pids.max", strconv.Itoa(lim.pids))
}

// oomKills reads how many times the kernel has killed a process of the cgroup for want of
// memory (memory.events in v2, memory.oom_control in v1; Linux 4.13 or later).
func (c *cgroup) oomKills() (int64, bool) {
	for _, dir := range c.dirs {
		for _, file := range []string{"memory.events", "memory.oom_control"} {
			data, err := os.ReadFile(filepath.Join(dir, file))
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(data), "\n") {
				if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
					n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					return n, err == nil
				}
			}
		}
	}
	return 0, false
}

// add moves a process into the cgroup. It is called before the process forks, so all its
// descendants are born inside.
func (c *cgroup) add(pid int) error {
	for _, dir := range c.dirs {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("join cgroup %s: %w", dir, err)
		}
	}
	return nil
}

// remove kills whatever is left in the cgroup and removes its folders, waiting until the kernel
// lets go of them (rmdir fails with EBUSY while a dying process is still accounted). Right
// after a command that is bwrap's pid 1 finishing its exit (bwrap exits on the status pid 1
// sends, before pid 1 is gone), usually over by the first retry: so the waits start short and
// grow to removeRetryMax.
func (c *cgroup) remove(stop <-chan struct{}) error {
	c.closeBase()
	wait := removeRetryMin
	for {
		var left []string
		for _, dir := range c.dirs {
			procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			for _, f := range strings.Fields(string(procs)) {
				if pid, err := strconv.Atoi(f); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
				left = append(left, dir)
			}
		}
		c.dirs = left
		if len(left) == 0 {
			return nil
		}
		select {
		case <-stop:
			return fmt.Errorf("cgroups %s still busy", strings.Join(left, ", "))
		case <-time.After(wait):
		}
		wait = min(2*wait, removeRetryMax)
	}
}
