package sandbox

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/boxcar-run/boxcar/internal/config"
)

// Start makes the sandbox's folder and cgroup and returns at once: each Exec is its own bwrap
// invocation sharing the workdir, so there is nothing to boot.
func (p *BubblewrapProvider) Start(ctx context.Context, spec Spec) (Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sandbox: start: %w", err)
	}
	if err := spec.Complete(); err != nil {
		return nil, fmt.Errorf("sandbox: start: %w", err)
	}
	lim, err := parseLimits(spec.SandboxSpec)
	if err != nil {
		return nil, err
	}
	workdir := path.Clean(spec.Workdir)
	if err := checkWorkdir(workdir); err != nil {
		return nil, err
	}
	rootfs := p.hostLayout
	if spec.Image != "" {
		if rootfs, err = imageLayout(spec.Image, workdir); err != nil {
			return nil, err
		}
	}

	id := "boxcar-" + safeID(spec.JobID) + "-" + randomHex(4)
	if spec.Pool != "" {
		id = "boxcar-pool-" + safeID(spec.Pool) + "-" + randomHex(4)
	}
	// The lock comes first and goes last: whatever exists of the sandbox, a lock file says
	// whose it is (leftovers.go).
	lock, err := lockSandbox(p.root, id)
	if err != nil {
		return nil, err
	}
	s := &bubblewrapSandbox{
		p: p, id: id, hostDir: filepath.Join(p.root, id), scratchDir: filepath.Join(p.root, id+scratchSuffix), egressDir: filepath.Join(p.root, id+egressSuffix), image: spec.Image, lock: lock, workdir: workdir, disk: newDiskBound(lim.disk), uid: -1,
		log:   p.log.With("sandbox_id", id, "job_id", spec.JobID, "tenant", spec.Tenant),
		calls: newCalls(), lifetime: time.Duration(spec.Lifetime),
	}
	if spec.Pool != "" {
		s.log = p.log.With("sandbox_id", id, "pool", spec.Pool)
	}
	if err := s.setup(spec, lim, rootfs); err != nil {
		s.shutdown(fmt.Errorf("sandbox %s: failed to start: %w", id, ErrClosed))
		if cerr := s.cleanup(nil); cerr != nil {
			s.log.Warn("sandbox cleanup after failed start", "error", cerr)
		}
		return nil, err
	}
	s.expiry = time.AfterFunc(spec.Ahead+s.lifetime, s.expire)
	s.pooled = spec.Pool != ""
	s.log.Info("sandbox started", "backend", p.Backend(), "isolation", s.info.Isolation)
	return s, nil
}

func (s *bubblewrapSandbox) setup(spec Spec, lim limits, rootfs []string) error {
	p := s.p
	owner := -1
	if p.asRoot {
		uid, err := p.allocUID()
		if err != nil {
			return err
		}
		s.uid, owner = uid, uid
		s.cred = credential(uid)
	}
	if err := s.makeHostFolders(owner, lim.disk); err != nil {
		return err
	}
	wd, err := openWorkdir(s.hostDir, owner, owner, p.diskMount)
	if err != nil {
		return fmt.Errorf("sandbox: start: %w", err)
	}
	s.wd = wd

	var inForce []string
	if len(p.cgroups.controllers()) > 0 {
		cg, errs := p.cgroups.newCgroup(s.id, cgroupLimits{memory: lim.memory + p.workdirMemory(s.disk), pids: spec.PIDs, cpuMilli: lim.cpuMilli})
		for _, err := range errs {
			s.log.Warn("cgroup limit not in force; rlimits still apply", "error", err)
		}
		s.cg, inForce = cg, cg.controllers
		if err := s.lock.record(cg.dirs); err != nil {
			return err
		}
	}

	memoryCgroup := slices.Contains(inForce, ctlMemory)
	s.seccomp = p.seccomp.choose(memoryCgroup)
	s.rlimits = p.rlimits(spec, lim, memoryCgroup)

	s.args = s.bwrapArgs(spec, lim.disk, rootfs)

	s.info = Info{
		Backend: p.Backend(), ID: s.id, Image: spec.Image,
		CPU: spec.CPU, Memory: spec.Memory, Disk: spec.Disk, PIDs: spec.PIDs,
		Isolation: s.isolation(inForce, lim),
	}
	if s.seccomp != nil {
		s.info.Seccomp, s.info.SeccompDigest = s.seccomp.name, s.seccomp.digest
	}
	return nil
}

// rlimits are a sandbox's: they hold for bwrap and everything it starts, each at most the
// worker's hard limit. RLIMIT_NPROC counts the processes of one host uid, which is the
// sandbox's own when the worker is root: then it bounds the whole sandbox, every Exec
// together. Otherwise the uid is the worker's, whose own threads would count, so it is left to
// the pids cgroup.
func (p *BubblewrapProvider) rlimits(spec Spec, lim limits, memoryCgroup bool) []rlimit {
	out := []rlimit{
		{"fsize", unix.RLIMIT_FSIZE, uint64(lim.disk)},
		{"nofile", unix.RLIMIT_NOFILE, openFilesLimit},
		{"cpu", unix.RLIMIT_CPU, lim.cpuSeconds},
		{"core", unix.RLIMIT_CORE, 0},
		{"msgqueue", unix.RLIMIT_MSGQUEUE, messageQueueBytes},
		{"sigpending", unix.RLIMIT_SIGPENDING, sigPendingLimit},
	}
	if p.asRoot {
		out = append([]rlimit{{"nproc", unix.RLIMIT_NPROC, uint64(spec.PIDs)}}, out...)
	}
	if !memoryCgroup {
		// Address space is a crude stand-in for memory: it counts reservations as well as
		// use, so runtimes that reserve large ranges (Go, the JVM, V8) need generous limits.
		// It is used only where no memory cgroup can measure the real thing.
		out = append(out, rlimit{"as", unix.RLIMIT_AS, uint64(lim.memory)})
	}
	for i, r := range out {
		out[i].value = min(r.value, p.hardLimits[r.resource])
	}
	return out
}

// makeHostFolders makes the sandbox's folders on the host, given to owner (-1: the worker's):
// the workdir and the scratch folder, each a tmpfs of its own where the worker may mount one
// (bubblewrap_disk.go), and the egress folder.
func (s *bubblewrapSandbox) makeHostFolders(owner int, disk int64) error {
	for _, dir := range []string{s.hostDir, s.scratchDir, s.egressDir} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			return fmt.Errorf("sandbox: start: make %s: %w", dir, err)
		}
	}
	if s.p.diskMount {
		if err := mountWorkdir(s.hostDir, s.disk, owner); err != nil {
			return err
		}
		if err := mountScratch(s.scratchDir, newDiskBound(disk), owner); err != nil {
			return err
		}
	}
	if owner < 0 {
		return nil
	}
	for _, dir := range []string{s.hostDir, s.egressDir} {
		if err := os.Chown(dir, owner, owner); err != nil {
			return fmt.Errorf("sandbox: start: give %s to uid %d: %w", dir, owner, err)
		}
	}
	return nil
}

// bwrapArgs are the bwrap options every Exec of the sandbox starts from. Each Exec adds its
// own binds, then makes the root read-only (options).
func (s *bubblewrapSandbox) bwrapArgs(spec Spec, disk int64, rootfs []string) []string {
	p := s.p
	args := []string{
		"--unshare-all", "--unshare-user", "--uid", strconv.Itoa(sandboxUID), "--gid", strconv.Itoa(sandboxGID),
		"--hostname", hostname, "--die-with-parent", "--new-session", "--cap-drop", "ALL",
	}
	if p.disableUserns {
		args = append(args, "--disable-userns")
	}
	args = append(args, rootfs...)
	if spec.Image == "" {
		s.etc = etcFiles(s.workdir)
		for i, f := range s.etc {
			args = append(args, "--ro-bind-data", strconv.Itoa(fdEtc+i), f.name)
		}
	}
	if s.seccomp != nil {
		// After the /etc files in the descriptors each Exec passes (prepare).
		args = append(args, "--seccomp", strconv.Itoa(fdEtc+len(s.etc)))
	}
	// bwrap's /dev is a tmpfs of no size, owned by the sandbox's user: once /dev/shm is
	// mounted on it, it is made read-only, which leaves its device nodes, /dev/pts and
	// /dev/shm writable, and nothing else.
	args = append(args, "--proc", "/proc", "--dev", "/dev")
	args = append(args, s.scratchArgs(disk)...)
	return append(args, "--remount-ro", "/dev", "--bind", s.hostDir, s.workdir)
}

// isolation says what this sandbox enforces, for the manifest.
func (s *bubblewrapSandbox) isolation(cgroups []string, lim limits) string {
	var b strings.Builder
	b.WriteString("namespaces=user,mount,pid,ipc,uts,net,cgroup; network=none; capabilities=none; root=read-only")
	if s.uid >= 0 {
		fmt.Fprintf(&b, "; host_uid=%d(own)", s.uid)
	} else {
		b.WriteString("; host_uid=worker's")
	}
	if s.p.disableUserns {
		b.WriteString("; nested_userns=off")
	}
	if s.seccomp != nil {
		fmt.Fprintf(&b, "; seccomp=%s(%s)", s.seccomp.name, s.seccomp.digest)
	} else {
		b.WriteString("; seccomp=none")
	}
	if len(cgroups) > 0 {
		fmt.Fprintf(&b, "; cgroup-v%d=%s", s.p.cgroups.version, strings.Join(cgroups, ","))
	} else {
		b.WriteString("; cgroup=none")
	}
	names := make([]string, len(s.rlimits))
	for i, r := range s.rlimits {
		names[i] = r.name
	}
	fmt.Fprintf(&b, "; rlimits=%s", strings.Join(names, ","))
	if s.p.diskMount {
		c := s.disk.ceiling()
		fmt.Fprintf(&b, "; disk=tmpfs(size=%d,nr_inodes=%d)+bound(%d bytes,%d inodes; statfs every %s-%s during exec, after exec and write)",
			c.bytes, c.inodes, s.disk.bytes, s.disk.inodes, diskPollMin, diskPollMax)
	} else {
		fmt.Fprintf(&b, "; disk=best-effort(rlimit-fsize+workdir walk every %s-%s during exec, after exec and write; misses unlinked open files)", diskPollMin, diskPollMax)
	}
	b.WriteString("; " + s.scratchIsolation(lim.disk) + "; dev=read-only")
	return b.String()
}

// limits are the spec's quantities in the units the kernel takes.
type limits struct {
	memory, disk int64 // bytes
	cpuMilli     int64 // thousandths of a core
	cpuSeconds   uint64
}

func parseLimits(spec config.SandboxSpec) (limits, error) {
	var l limits
	for _, q := range []struct {
		field, value string
		set          func(resource.Quantity)
	}{
		{"memory", spec.Memory, func(q resource.Quantity) { l.memory = q.Value() }},
		{"disk", spec.Disk, func(q resource.Quantity) { l.disk = q.Value() }},
		{"cpu", spec.CPU, func(q resource.Quantity) { l.cpuMilli = q.MilliValue() }},
	} {
		v, err := resource.ParseQuantity(q.value)
		if err != nil || v.Sign() <= 0 {
			return limits{}, fmt.Errorf("sandbox: start: sandbox.%s %q is not a positive quantity such as 500m, 1, 512Mi or 1Gi", q.field, q.value)
		}
		q.set(v)
	}
	if spec.PIDs < 1 {
		return limits{}, fmt.Errorf("sandbox: start: sandbox.pids %d must be at least 1", spec.PIDs)
	}
	// No process can use more CPU time than the sandbox's cores over its whole lifetime;
	// where no cpu cgroup throttles, this at least ends a runaway loop.
	l.cpuSeconds = uint64(max(1, (l.cpuMilli*int64(time.Duration(spec.Lifetime).Seconds())+999)/1000))
	return l, nil
}

type rlimit struct {
	name     string // as the manifest's isolation names it
	resource int
	value    uint64
}
