package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/big"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/boxcar-run/boxcar/internal/config"
)

var (
	_ Provider = (*BubblewrapProvider)(nil)
	_ Sandbox  = (*bubblewrapSandbox)(nil)
)

// BubblewrapConfig configures the single-machine backend.
type BubblewrapConfig struct {
	// BwrapPath is the bwrap binary. Default: "bwrap", looked up in PATH.
	BwrapPath string
	// Root is the host folder under which each sandbox gets a private folder (mode 0700).
	// Required; made if missing.
	Root string
	// Logger receives sandbox lifecycle events, never command output. Default: discards.
	Logger *slog.Logger
	// FirstUID and UIDs give the range of host user and group ids that sandboxes run as when
	// the worker runs as root. Each live sandbox gets an id of its own, so that RLIMIT_NPROC
	// counts that sandbox's processes alone and no two sandboxes, nor any host account, share
	// file ownership. Default: 1900000000 and 1000000, above the ranges systemd and container
	// engines hand out for user namespaces. Host root is never used: even mapped to an
	// ordinary user inside the sandbox it would own, and could chmod, the host device nodes
	// that bubblewrap binds into /dev. When the worker is not root, sandboxed processes run as
	// the worker's user and these are ignored.
	FirstUID, UIDs int
	// PrlimitPath is util-linux prlimit, which sets the rlimits on itself and then executes
	// bwrap, so that they hold before anything in the sandbox runs. Default: "prlimit" from PATH.
	PrlimitPath string
	// DisableCgroups bounds sandboxes with rlimits only, even where a writable cgroup hierarchy
	// exists. Default: false (cgroups where the host allows them).
	DisableCgroups bool
}

// WithDefaults returns a copy with every unset field at its documented default.
func (c BubblewrapConfig) WithDefaults() BubblewrapConfig {
	if c.BwrapPath == "" {
		c.BwrapPath = "bwrap"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.FirstUID == 0 {
		c.FirstUID = 1_900_000_000
	}
	if c.UIDs == 0 {
		c.UIDs = 1_000_000
	}
	if c.PrlimitPath == "" {
		c.PrlimitPath = "prlimit"
	}
	return c
}

func (c BubblewrapConfig) validate() error {
	if c.Root == "" {
		return errors.New("sandbox: bubblewrap: Root is required: set sandbox.bubblewrap.root to a folder for per-job workdirs")
	}
	if c.FirstUID < 1000 || c.UIDs < 1 || int64(c.FirstUID)+int64(c.UIDs) > 1<<32-2 {
		return fmt.Errorf("sandbox: bubblewrap: host uid range %d+%d: must start at 1000 or above (ids of no host account) and end below 2^32-1; the default is 1900000000+1000000", c.FirstUID, c.UIDs)
	}
	return nil
}

// Inside the sandbox every command runs as this user and group, mapped to the host user the
// sandbox runs as. It is not root, so the processes hold no capabilities even in their own
// user namespace.
const (
	sandboxUID = 1000
	sandboxGID = 1000
)

// Fixed bounds that the sandbox spec does not name.
const (
	openFilesLimit = 1024 // RLIMIT_NOFILE per process
	defaultPATH    = "/usr/local/bin:/usr/bin:/bin"
	// A running command's workdir is measured every diskPollMin, or diskPollFactor times as
	// long as a measurement takes when the tree is large, but at least every diskPollMax. What
	// a command can write beyond the bound is what it writes in one interval.
	diskPollMin    = 25 * time.Millisecond
	diskPollMax    = time.Second
	diskPollFactor = 20               // measuring takes at most 1/20 of a core
	waitDelay      = 5 * time.Second  // after a kill, how long output pipes may stay open
	cleanupGrace   = 30 * time.Second // bound on cleanup after the lifetime passes
	probeTimeout   = 10 * time.Second // bound on the bwrap probes at construction
	hostname       = "boxcar"
)

// The file descriptors each bwrap invocation receives (ExtraFiles start at 3). bwrap reads its
// options from a pipe (--args), which keeps environment values out of the host's process list
// and, above all, holds bwrap before it clones anything: the worker moves it into the
// sandbox's cgroup and only then writes the options.
const (
	fdArgs = 3
	fdEtc  = 4 // first synthesised /etc file; the rest follow
)

// BubblewrapProvider starts sandboxes with bubblewrap on this machine.
type BubblewrapProvider struct {
	bwrap, prlimit string
	root           string
	log            *slog.Logger
	// asRoot is true when the worker runs as root and so gives each sandbox a host uid of its
	// own from [firstUID, firstUID+uids).
	asRoot         bool
	firstUID, uids int
	cgroups        cgroupHost
	hardLimits     map[int]uint64 // the worker's hard rlimits, which the sandbox's cannot exceed
	// Optional bwrap features, by version: --size (0.7) bounds /tmp, --disable-userns (0.8)
	// stops nested user namespaces.
	tmpSize, disableUserns bool
	hostLayout             []string // bwrap options for the host's read-only /usr, /bin, /lib...

	mu    sync.Mutex
	inUse map[int]bool // host uids of live sandboxes
}

// NewBubblewrap checks that bubblewrap can make sandboxes here and finds the resource controls
// the machine offers. A missing bwrap or prlimit, or a kernel that refuses unprivileged user
// namespaces, fails with ErrUnavailable.
func NewBubblewrap(cfg BubblewrapConfig) (*BubblewrapProvider, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	bwrap, err := exec.LookPath(cfg.BwrapPath)
	if err != nil {
		return nil, fmt.Errorf("sandbox: bubblewrap: %s not found; install it with `apt-get install -y bubblewrap`: %w", cfg.BwrapPath, ErrUnavailable)
	}
	prlimit, err := exec.LookPath(cfg.PrlimitPath)
	if err != nil {
		return nil, fmt.Errorf("sandbox: bubblewrap: %s not found (it sets the sandbox's rlimits); install it with `apt-get install -y util-linux`: %w", cfg.PrlimitPath, ErrUnavailable)
	}
	p := &BubblewrapProvider{
		bwrap: bwrap, prlimit: prlimit, log: cfg.Logger,
		asRoot: os.Geteuid() == 0, firstUID: cfg.FirstUID, uids: cfg.UIDs,
		inUse: map[int]bool{}, hardLimits: map[int]uint64{},
	}
	if p.root, err = prepareRoot(cfg.Root, p.asRoot); err != nil {
		return nil, err
	}
	for _, r := range []int{unix.RLIMIT_NPROC, unix.RLIMIT_FSIZE, unix.RLIMIT_NOFILE, unix.RLIMIT_CPU, unix.RLIMIT_CORE, unix.RLIMIT_AS} {
		var l unix.Rlimit
		if err := unix.Getrlimit(r, &l); err != nil {
			return nil, fmt.Errorf("sandbox: bubblewrap: read rlimits: %w", err)
		}
		p.hardLimits[r] = l.Max
	}

	help, _ := p.probe(nil, p.bwrap, "--help")
	for _, opt := range []string{"--args", "--ro-bind-data", "--die-with-parent", "--unshare-user", "--clearenv"} {
		if !bytes.Contains(help, []byte(opt)) {
			return nil, fmt.Errorf("sandbox: bubblewrap: %s lacks %s (0.5 or later is needed); install a current one with `apt-get install -y bubblewrap`: %w", bwrap, opt, ErrUnavailable)
		}
	}
	p.tmpSize = bytes.Contains(help, []byte("--size"))
	p.disableUserns = bytes.Contains(help, []byte("--disable-userns"))

	var cred *syscall.Credential
	if p.asRoot {
		cred = credential(p.firstUID)
	}
	if out, err := p.probe(cred, p.bwrap, "--unshare-all", "--unshare-user", "--ro-bind", "/", "/", "--proc", "/proc", "--", "true"); err != nil {
		return nil, fmt.Errorf("sandbox: bubblewrap cannot make namespaces here (%s): allow unprivileged user namespaces (sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1, or an AppArmor profile for bwrap): %w",
			firstLine(out, err), ErrUnavailable)
	}
	p.hostLayout = hostLayout()
	if !cfg.DisableCgroups {
		p.cgroups = findCgroups()
	}
	if n, err := p.removeLeftovers(); err != nil {
		p.log.Warn("could not remove everything sandboxes of a stopped worker left", "removed", n, "error", err)
	} else if n > 0 {
		p.log.Warn("removed sandboxes left by a worker that stopped", "removed", n)
	}
	p.log.Info("bubblewrap sandboxes ready", "bwrap", bwrap, "root", p.root, "cgroup_version", p.cgroups.version,
		"cgroup_controllers", strings.Join(p.cgroups.controllers(), ","), "per_sandbox_uid", p.asRoot)
	return p, nil
}

// prepareRoot makes the root folder. Sandboxes run as unprivileged host users and bwrap, running
// as them, resolves the workdir by path, so the root and every folder above it must be
// searchable by others (o+x). The root is not listable, and each workdir is 0700 and owned by
// its sandbox's own uid, so searchability reveals nothing.
func prepareRoot(root string, asRoot bool) (string, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return "", fmt.Errorf("sandbox: bubblewrap: root %s: %w", root, err)
	}
	mode := os.FileMode(0o700)
	if asRoot {
		mode = 0o711
	}
	if err := os.MkdirAll(root, mode); err != nil {
		return "", fmt.Errorf("sandbox: bubblewrap: make root %s: %w", root, err)
	}
	if err := os.Chmod(root, mode); err != nil {
		return "", fmt.Errorf("sandbox: bubblewrap: root %s: %w", root, err)
	}
	if !asRoot {
		return root, nil
	}
	for dir := filepath.Dir(root); ; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err != nil {
			return "", fmt.Errorf("sandbox: bubblewrap: root %s: %w", root, err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return "", fmt.Errorf("sandbox: bubblewrap: root %s: %s is not searchable by other users (mode %v), but sandboxes run as unprivileged users that must reach their workdirs; chmod o+x %s or choose a root elsewhere",
				root, dir, fi.Mode().Perm(), dir)
		}
		if dir == "/" {
			return root, nil
		}
	}
}

func credential(uid int) *syscall.Credential {
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid), Groups: []uint32{}}
}

// probe runs a program once with a time bound; the constructor has no context to bound it with.
func (p *BubblewrapProvider) probe(cred *syscall.Credential, name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	t := time.AfterFunc(probeTimeout, func() { _ = cmd.Process.Kill() })
	err := cmd.Wait()
	t.Stop()
	return out.Bytes(), err
}

func firstLine(out []byte, err error) string {
	if line, _, _ := bytes.Cut(bytes.TrimSpace(out), []byte("\n")); len(line) > 0 {
		return string(line)
	}
	if err == nil {
		return "no output"
	}
	return err.Error()
}

// allocUID picks an unused host uid for a sandbox. Picking at random keeps two workers sharing
// a range from colliding in practice; within one worker the set rules it out.
func (p *BubblewrapProvider) allocUID() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.inUse) >= p.uids {
		return 0, fmt.Errorf("sandbox: start: all %d host uids from %d are taken; widen the range (FirstUID, UIDs)", p.uids, p.firstUID)
	}
	for {
		n, err := rand.Int(rand.Reader, big.NewInt(int64(p.uids)))
		if err != nil {
			return 0, fmt.Errorf("sandbox: start: pick a host uid: %w", err)
		}
		uid := p.firstUID + int(n.Int64())
		if !p.inUse[uid] {
			p.inUse[uid] = true
			return uid, nil
		}
	}
}

func (p *BubblewrapProvider) freeUID(uid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.inUse, uid)
}

// hostLayout mirrors the host's program folders read-only, keeping symlinks as symlinks (on a
// merged-/usr system /bin is a link to usr/bin), and only the few /etc entries that dynamically
// linked programs need. passwd, group and the like are synthesised per sandbox instead.
func hostLayout() []string {
	var args []string
	for _, dir := range []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		fi, err := os.Lstat(dir)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			if target, err := os.Readlink(dir); err == nil {
				args = append(args, "--symlink", target, dir)
			}
		case fi.IsDir():
			args = append(args, "--ro-bind", dir, dir)
		}
	}
	for _, name := range []string{"/etc/ld.so.cache", "/etc/alternatives"} {
		if _, err := os.Stat(name); err == nil {
			args = append(args, "--ro-bind", name, name)
		}
	}
	return args
}

// etcFiles are synthesised so that programs that look up users or hosts work, without showing
// the host's own accounts.
func etcFiles(workdir string) []etcFile {
	return []etcFile{
		{"/etc/passwd", fmt.Sprintf("root:x:0:0:root:/nonexistent:/usr/sbin/nologin\nagent:x:%d:%d:agent:%s:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", sandboxUID, sandboxGID, workdir)},
		{"/etc/group", fmt.Sprintf("root:x:0:\nagent:x:%d:\nnogroup:x:65534:\n", sandboxGID)},
		{"/etc/hosts", "127.0.0.1\tlocalhost " + hostname + "\n::1\tlocalhost\n"},
		{"/etc/nsswitch.conf", "passwd: files\ngroup: files\nshadow: files\nhosts: files\n"},
	}
}

type etcFile struct{ name, content string }

// Backend names the backend.
func (p *BubblewrapProvider) Backend() string { return "bubblewrap" }

// Start makes the sandbox's folder and cgroup and returns at once: each Exec is its own bwrap
// invocation sharing the workdir, so there is nothing to boot.
func (p *BubblewrapProvider) Start(ctx context.Context, spec Spec) (Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sandbox: start: %w", err)
	}
	spec.SandboxSpec = config.Profile{Sandbox: spec.SandboxSpec}.WithDefaults().Sandbox
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
	// The lock comes first and goes last: whatever exists of the sandbox, a lock file says
	// whose it is (leftovers.go).
	lock, err := lockSandbox(p.root, id)
	if err != nil {
		return nil, err
	}
	s := &bubblewrapSandbox{
		p: p, id: id, hostDir: filepath.Join(p.root, id), lock: lock, workdir: workdir, disk: lim.disk, uid: -1,
		log:   p.log.With("sandbox_id", id, "job_id", spec.JobID),
		calls: newCalls(),
	}
	if err := s.setup(spec, lim, rootfs); err != nil {
		s.shutdown(fmt.Errorf("sandbox %s: failed to start: %w", id, ErrClosed))
		if cerr := s.cleanup(nil); cerr != nil {
			s.log.Warn("sandbox cleanup after failed start", "error", cerr)
		}
		return nil, err
	}
	s.expiry = time.AfterFunc(time.Duration(spec.Lifetime), s.expire)
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
	if err := os.Mkdir(s.hostDir, 0o700); err != nil {
		return fmt.Errorf("sandbox: start: make %s: %w", s.hostDir, err)
	}
	if owner >= 0 {
		if err := os.Chown(s.hostDir, owner, owner); err != nil {
			return fmt.Errorf("sandbox: start: give %s to uid %d: %w", s.hostDir, owner, err)
		}
	}
	wd, err := openWorkdir(s.hostDir, owner, owner)
	if err != nil {
		return fmt.Errorf("sandbox: start: %w", err)
	}
	s.wd = wd

	var inForce []string
	if len(p.cgroups.controllers()) > 0 {
		cg, errs := p.cgroups.newCgroup(s.id, cgroupLimits{memory: lim.memory, pids: spec.PIDs, cpuMilli: lim.cpuMilli})
		for _, err := range errs {
			s.log.Warn("cgroup limit not in force; rlimits still apply", "error", err)
		}
		s.cg, inForce = cg, cg.controllers
		if err := s.lock.record(cg.dirs); err != nil {
			return err
		}
	}

	// rlimits hold for bwrap and everything it starts. RLIMIT_NPROC counts the processes of
	// one host uid, which is the sandbox's own when the worker is root: then it bounds the
	// whole sandbox, every Exec together. Otherwise the uid is the worker's, whose own threads
	// would count, so it is left to the pids cgroup.
	s.rlimits = []rlimit{
		{"fsize", unix.RLIMIT_FSIZE, uint64(lim.disk)},
		{"nofile", unix.RLIMIT_NOFILE, openFilesLimit},
		{"cpu", unix.RLIMIT_CPU, lim.cpuSeconds},
		{"core", unix.RLIMIT_CORE, 0},
	}
	if p.asRoot {
		s.rlimits = append([]rlimit{{"nproc", unix.RLIMIT_NPROC, uint64(spec.PIDs)}}, s.rlimits...)
	}
	if !slices.Contains(inForce, ctlMemory) {
		// Address space is a crude stand-in for memory: it counts reservations as well as
		// use, so runtimes that reserve large ranges (Go, the JVM, V8) need generous limits.
		// It is used only where no memory cgroup can measure the real thing.
		s.rlimits = append(s.rlimits, rlimit{"as", unix.RLIMIT_AS, uint64(lim.memory)})
	}
	s.wrapper = []string{s.p.prlimit}
	for _, r := range s.rlimits {
		v := min(r.value, p.hardLimits[r.resource])
		s.wrapper = append(s.wrapper, fmt.Sprintf("--%s=%d:%d", r.name, v, v))
	}
	s.wrapper = append(s.wrapper, "--", s.p.bwrap, "--args", strconv.Itoa(fdArgs), "--")

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
	args = append(args, "--proc", "/proc", "--dev", "/dev")
	if p.tmpSize {
		args = append(args, "--size", strconv.FormatInt(lim.disk, 10))
	}
	args = append(args, "--tmpfs", "/tmp",
		"--bind", s.hostDir, s.workdir,
		"--remount-ro", "/",
		"--clearenv")
	s.args = args

	s.info = Info{
		Backend: p.Backend(), ID: s.id, Image: spec.Image,
		CPU: spec.CPU, Memory: spec.Memory, Disk: spec.Disk, PIDs: spec.PIDs,
		Isolation: s.isolation(inForce, lim),
	}
	return nil
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
	fmt.Fprintf(&b, "; disk=rlimit-fsize+workdir-usage-check(every %s-%s during exec, after exec and write)", diskPollMin, diskPollMax)
	if s.p.tmpSize {
		fmt.Fprintf(&b, "; tmp=tmpfs(%d bytes)", lim.disk)
	} else {
		b.WriteString("; tmp=tmpfs(unbounded: bwrap lacks --size)")
	}
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

// reservedDirs are where the sandbox's own mounts go; a workdir there would hide them.
var reservedDirs = []string{"/proc", "/dev", "/tmp", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

func checkWorkdir(dir string) error {
	if !path.IsAbs(dir) || dir == "/" {
		return fmt.Errorf("sandbox: start: workdir %q must be an absolute path other than /, such as /work", dir)
	}
	for _, r := range reservedDirs {
		if dir == r || strings.HasPrefix(dir, r+"/") {
			return fmt.Errorf("sandbox: start: workdir %q lies in %s, which the sandbox mounts itself; use a folder such as /work", dir, r)
		}
	}
	return nil
}

// imageLayout mounts a rootfs folder read-only. Each top-level entry is bound on its own onto
// bwrap's fresh root rather than the folder as a whole, so that the workdir, /proc, /dev and
// /tmp can be made as mount points without writing into the image.
func imageLayout(image, workdir string) ([]string, error) {
	if !filepath.IsAbs(image) {
		return nil, fmt.Errorf("sandbox: start: image %q: name a rootfs folder by its absolute path (the bubblewrap backend takes a folder, not a container image)", image)
	}
	entries, err := os.ReadDir(image)
	if err != nil {
		return nil, fmt.Errorf("sandbox: start: image %q is not a readable rootfs folder (the bubblewrap backend takes a folder, not a container image): %w", image, err)
	}
	top := "/" + strings.SplitN(strings.TrimPrefix(workdir, "/"), "/", 2)[0]
	var args []string
	for _, e := range entries {
		dest := "/" + e.Name()
		switch dest {
		case "/proc", "/dev", "/tmp", "/sys":
			continue
		case top:
			if top != workdir {
				return nil, fmt.Errorf("sandbox: start: workdir %q would be made inside the read-only image folder %s; use a top-level workdir such as /work", workdir, dest)
			}
		}
		src := filepath.Join(image, e.Name())
		if e.Type()&os.ModeSymlink != 0 {
			target, err := os.Readlink(src)
			if err != nil {
				return nil, fmt.Errorf("sandbox: start: image %q: %w", image, err)
			}
			args = append(args, "--symlink", target, dest)
			continue
		}
		args = append(args, "--ro-bind", src, dest)
	}
	return args, nil
}

var unsafeID = regexp.MustCompile(`[^a-zA-Z0-9_.-]+`)

func safeID(jobID string) string {
	id := strings.Trim(unsafeID.ReplaceAllString(jobID, "-"), "-.")
	if len(id) > 40 {
		id = id[:40]
	}
	if id == "" {
		id = "job"
	}
	return id
}

type rlimit struct {
	name     string // prlimit's option name
	resource int
	value    uint64
}

// bubblewrapSandbox is one job's sandbox: a host folder bound at the workdir, a host uid, a
// cgroup, and the command line every Exec starts from.
type bubblewrapSandbox struct {
	p       *BubblewrapProvider
	id      string
	hostDir string       // the workdir on the host; removed on Close
	lock    *sandboxLock // held while any of the sandbox's host state exists
	workdir string       // the workdir's path inside the sandbox
	wd      *workdir
	disk    int64
	uid     int                 // the sandbox's host uid; -1 when the worker is not root
	cred    *syscall.Credential // switches to uid; nil when the worker is not root
	wrapper []string            // prlimit with the rlimits, then bwrap --args
	args    []string            // bwrap options shared by every Exec
	etc     []etcFile           // synthesised /etc files, passed from fdEtc on
	cg      *cgroup
	rlimits []rlimit
	info    Info
	log     *slog.Logger
	expiry  *time.Timer

	*calls

	closeMu sync.Mutex // serialises cleanup between Close and the lifetime timer
	cleaned bool
	wdShut  bool
}

// cleanup removes the cgroup and the host folder once no call is in flight, and frees the host
// uid. stop (nil: never) abandons the wait; a later Close tries again.
func (s *bubblewrapSandbox) cleanup(stop <-chan struct{}) error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.cleaned {
		return nil
	}
	select {
	case <-s.idle:
	case <-stop:
		return fmt.Errorf("sandbox: close %s: commands still running; call Close again", s.id)
	}
	var errs []error
	if s.cg != nil {
		if err := s.cg.remove(stop); err != nil {
			errs = append(errs, err)
		}
	}
	if s.wd != nil && !s.wdShut {
		s.wdShut = true
		_ = s.wd.close()
	}
	if err := removeTree(s.hostDir); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("sandbox: close %s: %w", s.id, errors.Join(errs...))
	}
	if s.lock != nil {
		if err := s.lock.release(); err != nil {
			// Unlocked, it is removed at the next start of a worker on this Root.
			s.log.Warn("sandbox lock file left behind", "error", err)
		}
		s.lock = nil
	}
	if s.uid >= 0 {
		// Only now: nothing of the sandbox is left to share the uid with its next owner.
		s.p.freeUID(s.uid)
	}
	s.cleaned = true
	return nil
}

// expire ends the sandbox when its lifetime passes, whatever the job is doing.
func (s *bubblewrapSandbox) expire() {
	s.shutdown(fmt.Errorf("sandbox %s: its lifetime passed: %w", s.id, ErrClosed))
	stop := make(chan struct{})
	t := time.AfterFunc(cleanupGrace, func() { close(stop) })
	defer t.Stop()
	if err := s.cleanup(stop); err != nil {
		s.log.Error("sandbox cleanup after lifetime", "error", err)
		return
	}
	s.log.Warn("sandbox removed: lifetime passed")
}

// Close kills every command still running, removes the cgroup and the workdir. It is
// idempotent; if ctx ends before the cleanup is done, a later Close finishes it.
func (s *bubblewrapSandbox) Close(ctx context.Context) error {
	s.expiry.Stop()
	s.shutdown(fmt.Errorf("sandbox %s: %w", s.id, ErrClosed))
	if err := s.cleanup(ctx.Done()); err != nil {
		return err
	}
	s.log.Info("sandbox closed")
	return nil
}

// Info describes the sandbox.
func (s *bubblewrapSandbox) Info() Info { return s.info }

// WriteFile creates or replaces a regular file in the workdir, creating parent folders.
func (s *bubblewrapSandbox) WriteFile(ctx context.Context, name string, data []byte) error {
	clean, err := CleanPath(name)
	if err != nil {
		return fmt.Errorf("sandbox: write: %w", err)
	}
	if clean == "." {
		return fmt.Errorf("sandbox: write %q: names the workdir itself; name a file: %w", name, ErrPathEscape)
	}
	id, err := s.begin(nil)
	if err != nil {
		return fmt.Errorf("sandbox: write %s: %w", clean, err)
	}
	defer s.end(id)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sandbox: write %s: %w", clean, err)
	}
	return s.wd.writeFile(clean, data, s.disk)
}

// ReadFile reads a regular file of at most maxBytes from the workdir.
func (s *bubblewrapSandbox) ReadFile(ctx context.Context, name string, maxBytes int64) ([]byte, error) {
	clean, err := CleanPath(name)
	if err != nil {
		return nil, fmt.Errorf("sandbox: read: %w", err)
	}
	id, err := s.begin(nil)
	if err != nil {
		return nil, fmt.Errorf("sandbox: read %s: %w", clean, err)
	}
	defer s.end(id)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sandbox: read %s: %w", clean, err)
	}
	return s.wd.readFile(clean, maxBytes)
}

// List returns the regular files under dir, recursively, without following symlinks.
func (s *bubblewrapSandbox) List(ctx context.Context, dir string) ([]FileInfo, error) {
	clean, err := CleanPath(dir)
	if err != nil {
		return nil, fmt.Errorf("sandbox: list: %w", err)
	}
	id, err := s.begin(nil)
	if err != nil {
		return nil, fmt.Errorf("sandbox: list %s: %w", clean, err)
	}
	defer s.end(id)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sandbox: list %s: %w", clean, err)
	}
	return s.wd.list(clean)
}

// Causes of a command's end that the result reports.
var (
	errExecTimeout = errors.New("command timed out")
	errExecDisk    = errors.New("workdir over its disk bound")
)

// Exec runs argv in a fresh bwrap invocation over the shared workdir.
//
// The process chain is prlimit (sets the rlimits on itself) → bwrap → bwrap's pid 1 → argv.
// bwrap reads its options from a pipe, and so waits before cloning anything until the worker
// has moved it into the sandbox's cgroup: the command and all it forks are bounded from their
// first instruction, with no process of the worker's left in between.
//
// When the workdir ends up over its disk bound, Exec returns the result together with an
// error wrapping ErrDiskFull.
func (s *bubblewrapSandbox) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	dir, maxOut, err := checkExec(req)
	if err != nil {
		return ExecResult{}, err
	}
	name := req.Argv[0]

	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	id, err := s.begin(cancel)
	if err != nil {
		return ExecResult{}, fmt.Errorf("sandbox: exec %s: %w", name, err)
	}
	defer s.end(id)
	if req.Timeout > 0 {
		var stop context.CancelFunc
		runCtx, stop = context.WithTimeoutCause(runCtx, req.Timeout, errExecTimeout)
		defer stop()
	}
	if dir != "." {
		fd, err := s.wd.openat(int(s.wd.fd.Fd()), dir, unix.O_PATH|unix.O_DIRECTORY, 0, resolveInside)
		if err != nil {
			return ExecResult{}, pathError("exec "+name+": dir", dir, err)
		}
		unix.Close(fd)
	}

	inv, err := s.prepare()
	if err != nil {
		return ExecResult{}, fmt.Errorf("sandbox: exec %s: %w", name, err)
	}
	defer inv.close()
	// Over its bound already, the workdir may shrink (a command that removes files) but not
	// grow.
	diskLimit := s.disk
	if used, err := s.wd.usage(); err == nil && used > diskLimit {
		diskLimit = used
	}
	oomBefore, oomKnown := s.oomKills()

	stdout := &cappedBuffer{max: maxOut}
	stderr := &cappedBuffer{max: maxOut}
	cmd := exec.CommandContext(runCtx, s.wrapper[0], append(s.wrapper[1:len(s.wrapper):len(s.wrapper)], req.Argv...)...)
	cmd.Env = []string{} // nothing of the worker's environment reaches even bwrap
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if req.Stdin != nil {
		cmd.Stdin = bytes.NewReader(req.Stdin)
	}
	cmd.ExtraFiles = inv.child
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: s.cred}
	var killed atomic.Bool
	// bwrap's child is pid 1 of the command's pid namespace and dies with bwrap
	// (--die-with-parent); when pid 1 dies the kernel kills everything else in the namespace.
	// So killing bwrap's process group ends the whole tree, however it forked or detached.
	cmd.Cancel = func() error {
		killed.Store(true)
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = waitDelay

	start := time.Now()
	if err := cmd.Start(); err != nil {
		return ExecResult{}, fmt.Errorf("sandbox: exec %s: start %s: %w", name, s.wrapper[0], err)
	}
	inv.closeChildEnds()
	if err := s.release(inv, cmd.Process.Pid, s.options(req, path.Join(s.workdir, dir))); err != nil && runCtx.Err() == nil {
		// The command could not be bounded, or bwrap died early: it must not run.
		cancel(err)
		_ = cmd.Wait()
		errOut, _ := stderr.take()
		return ExecResult{}, fmt.Errorf("sandbox: exec %s: could not start the sandbox: %v (%s)", name, err, firstLine(errOut, nil))
	}
	// Otherwise a kill (timeout, ctx, Close) interrupted the set-up: reported below as usual.

	watchDone := make(chan struct{})
	watchStop := make(chan struct{})
	go func() {
		defer close(watchDone)
		s.watchDisk(watchStop, cancel, diskLimit)
	}()
	waitErr := cmd.Wait()
	close(watchStop)
	<-watchDone

	res := ExecResult{Duration: time.Since(start)}
	res.Stdout, res.StdoutTruncated = stdout.take()
	res.Stderr, res.StderrTruncated = stderr.take()
	if cmd.ProcessState == nil {
		return res, fmt.Errorf("sandbox: exec %s: %w", name, waitErr)
	}
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		res.ExitCode = 128 + int(ws.Signal())
	} else {
		res.ExitCode = ws.ExitStatus()
	}
	if oomAfter, ok := s.oomKills(); oomKnown && ok && oomAfter > oomBefore {
		s.noteOOM(&res, maxOut)
	}

	if killed.Load() {
		switch cause := context.Cause(runCtx); {
		case errors.Is(cause, errExecTimeout):
			res.TimedOut = true
		case errors.Is(cause, errExecDisk):
			return res, s.diskError(name)
		default:
			return res, stopError(ctx, name, cause)
		}
	} else if err := s.launcherFailure(&res, req); err != nil {
		return ExecResult{}, fmt.Errorf("sandbox: exec %s: %w", name, err)
	}
	s.log.Debug("exec", "argv0", name, "exit_code", res.ExitCode, "timed_out", res.TimedOut,
		"duration_ms", res.Duration.Milliseconds())
	if used, err := s.wd.usage(); err == nil && used > s.disk {
		return res, s.diskError(name)
	}
	return res, nil
}

// stopError reports a command killed because the caller's ctx ended or the sandbox closed.
func stopError(ctx context.Context, name string, cause error) error {
	if err := ctx.Err(); err != nil {
		cause = err
	}
	return fmt.Errorf("sandbox: exec %s: killed: %w", name, cause)
}

func (s *bubblewrapSandbox) diskError(name string) error {
	used, _ := s.wd.usage()
	return fmt.Errorf("sandbox: exec %s: the workdir holds %d bytes, over its %d-byte disk bound; remove files: %w", name, used, s.disk, ErrDiskFull)
}

// launcherFailure tells prlimit's and bwrap's own errors apart from the command's exit status
// 1. A command that cannot be executed becomes the shell's 127 (not found) or 126 (not
// executable), as a result; any other complaint of theirs means the sandbox could not be set
// up, which is an error.
func (s *bubblewrapSandbox) launcherFailure(res *ExecResult, req ExecRequest) error {
	line, _, _ := bytes.Cut(res.Stderr, []byte("\n"))
	switch {
	case res.ExitCode == 0:
		return nil
	case bytes.HasPrefix(line, []byte("prlimit: ")):
		return fmt.Errorf("could not set the sandbox's rlimits: %s", line)
	case res.ExitCode != 1 || !bytes.HasPrefix(line, []byte("bwrap: ")):
		return nil
	}
	msg := strings.TrimPrefix(string(line), "bwrap: ")
	rest, ok := strings.CutPrefix(msg, "execvp ")
	if !ok {
		return fmt.Errorf("bubblewrap could not set up the sandbox: %s", msg)
	}
	reason := rest[strings.LastIndex(rest, ": ")+2:]
	res.ExitCode = 126
	text := fmt.Sprintf("boxcar sandbox: %s: cannot execute: %s\n", req.Argv[0], reason)
	if strings.EqualFold(reason, syscall.ENOENT.Error()) {
		res.ExitCode = 127
		pathEnv := defaultPATH
		if v, ok := req.Env["PATH"]; ok {
			pathEnv = v
		}
		text = fmt.Sprintf("boxcar sandbox: %s: command not found (PATH=%s)\n", req.Argv[0], pathEnv)
	}
	res.Stderr = []byte(text)
	res.StderrTruncated = false
	return nil
}

// oomKills is how many times the kernel has killed a process of the sandbox for want of
// memory, where a memory cgroup counts it.
func (s *bubblewrapSandbox) oomKills() (int64, bool) {
	if s.cg == nil || !slices.Contains(s.cg.controllers, ctlMemory) {
		return 0, false
	}
	return s.cg.oomKills()
}

// noteOOM tells the command's reader why a process died with SIGKILL: the kernel's OOM killer
// says nothing on the command's stderr. The note stays within the output cap.
func (s *bubblewrapSandbox) noteOOM(res *ExecResult, maxOut int) {
	note := fmt.Sprintf("boxcar sandbox: the kernel killed a process of the sandbox: it ran out of memory (limit %s)\n", s.info.Memory)
	if len(note) > maxOut {
		return
	}
	if keep := maxOut - len(note); len(res.Stderr) > keep {
		res.Stderr, res.StderrTruncated = res.Stderr[:keep], true
	}
	res.Stderr = append(slices.Clip(res.Stderr), note...)
}

// watchDisk kills the command when the workdir grows past limit. RLIMIT_FSIZE stops any single
// file at the bound; this stops many files adding up, within one poll interval.
func (s *bubblewrapSandbox) watchDisk(stop <-chan struct{}, kill context.CancelCauseFunc, limit int64) {
	t := time.NewTimer(diskPollMin)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		begin := time.Now()
		used, err := s.wd.usage()
		if err == nil && used > limit {
			kill(errExecDisk)
			return
		}
		t.Reset(min(max(diskPollFactor*time.Since(begin), diskPollMin), diskPollMax))
	}
}

// options are this Exec's bwrap options: the sandbox's, then the environment and the folder.
func (s *bubblewrapSandbox) options(req ExecRequest, chdir string) []byte {
	env := map[string]string{"PATH": defaultPATH, "HOME": s.workdir, "LANG": "C.UTF-8"}
	maps.Copy(env, req.Env)
	var b bytes.Buffer
	add := func(args ...string) {
		for _, a := range args {
			b.WriteString(a)
			b.WriteByte(0)
		}
	}
	add(s.args...)
	for _, k := range slices.Sorted(maps.Keys(env)) {
		add("--setenv", k, env[k])
	}
	add("--chdir", chdir)
	return b.Bytes()
}

// invocation holds the descriptors of one bwrap run: child are passed to it (from fd 3 on);
// argsWrite is the worker's end of the options pipe.
type invocation struct {
	child     []*os.File
	argsWrite *os.File
}

func (s *bubblewrapSandbox) prepare() (*invocation, error) {
	argsRead, argsWrite, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	inv := &invocation{child: []*os.File{argsRead}, argsWrite: argsWrite}
	for _, f := range s.etc {
		mf, err := memfile(path.Base(f.name), f.content)
		if err != nil {
			inv.close()
			return nil, err
		}
		inv.child = append(inv.child, mf)
	}
	return inv, nil
}

// closeChildEnds drops the worker's copies of what bwrap now holds.
func (inv *invocation) closeChildEnds() {
	for i, f := range inv.child {
		if f != nil {
			f.Close()
		}
		inv.child[i] = nil
	}
}

func (inv *invocation) close() {
	inv.closeChildEnds()
	inv.argsWrite.Close()
}

// release moves the waiting bwrap into the sandbox's cgroup and hands it its options. bwrap
// clones nothing before it has read them all, so every process of the sandbox is born inside.
func (s *bubblewrapSandbox) release(inv *invocation, pid int, options []byte) error {
	if s.cg != nil {
		if err := s.cg.add(pid); err != nil {
			return err
		}
	}
	if _, err := inv.argsWrite.Write(options); err != nil {
		return fmt.Errorf("hand bwrap its options: %w", err)
	}
	if err := inv.argsWrite.Close(); err != nil {
		return fmt.Errorf("hand bwrap its options: %w", err)
	}
	return nil
}

func memfile(name, content string) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return nil, fmt.Errorf("memfd: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("memfd: %w", err)
	}
	return f, nil
}
