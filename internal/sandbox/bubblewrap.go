package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxcar-run/boxcar/internal/spawn"
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
	// UIDClaims is the host folder where each live sandbox's host uid is claimed, for every
	// worker on the host whatever its Root: one per host, so that workers on two Roots never
	// give two sandboxes one uid. Made mode 0700, owned by root. Default: /run/boxcar/uids.
	UIDClaims string
	// DisableCgroups bounds sandboxes with rlimits only, even where a writable cgroup hierarchy
	// exists. Default: false (cgroups where the host allows them).
	DisableCgroups bool
	// DiskBestEffort lets the worker run where the kernel cannot bound a workdir's disk use:
	// that takes a tmpfs of the workdir's own, which only a worker that is root in the host's
	// mount namespace can mount. Without one, the bound is measured by walking the workdir,
	// which cannot see files unlinked while still open, so a job can exceed it. Default: false,
	// and then NewBubblewrap fails on such a host, since every profile has a disk bound.
	DiskBestEffort bool
	// BridgePath is the egress bridge, the binary run in front of each command of a sandbox
	// with egress (package bridge, which every binary linking this package holds). Default:
	// this process's own executable.
	BridgePath string

	// noDiskMount walks the workdir even where a tmpfs could be mounted (benchmarks' baseline).
	noDiskMount bool
	// noSeccomp runs sandboxes without the seccomp filter (benchmarks' baseline).
	noSeccomp bool
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
	if c.UIDClaims == "" {
		c.UIDClaims = DefaultUIDClaims
	}
	if c.BridgePath == "" {
		c.BridgePath, _ = os.Executable()
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

// DefaultUIDClaims is where the workers of a host claim their sandboxes' host uids.
const DefaultUIDClaims = "/run/boxcar/uids"

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
	// messageQueueBytes is RLIMIT_MSGQUEUE, what the sandbox's POSIX message queues may hold
	// (six queues of ten 8 KiB messages, the default size): not the worker's, which may be
	// unlimited. The kernel counts it per host uid, so per sandbox where each has its own (the
	// worker is root), else shared with the worker and the other sandboxes.
	messageQueueBytes = 512 << 10
	// sigPendingLimit is RLIMIT_SIGPENDING: the signals queued to the sandbox's processes and
	// its POSIX timers (each holds one from timer_create on) together, kernel memory that
	// RLIMIT_AS does not count; not the worker's, which may be unlimited. The kernel counts
	// it per host uid and caps each user namespace at its creator's, so per sandbox where each
	// has its own uid (the worker is root), else shared with the worker and the others.
	sigPendingLimit = 1024
	defaultPATH     = "/usr/local/bin:/usr/bin:/bin"
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
	bwrap string
	root  string
	log   *slog.Logger
	// asRoot is true when the worker runs as root and so gives each sandbox a host uid of its
	// own from [firstUID, firstUID+uids).
	asRoot         bool
	firstUID, uids int
	uidClaims      string // the host's folder of uid claims (bubblewrap_uid.go)
	cgroups        cgroupHost
	hardLimits     map[int]uint64 // the worker's hard rlimits, which the sandbox's cannot exceed
	// Optional bwrap features, by version: --size (0.7) bounds /tmp, --disable-userns (0.8)
	// stops nested user namespaces.
	tmpSize, disableUserns bool
	hostLayout             []string // bwrap options for the host's read-only /usr, /bin, /lib...
	// diskMount is true when each workdir gets a tmpfs of its own (bubblewrap_disk.go).
	diskMount bool
	seccomp   seccompFilters // none with noSeccomp

	// The egress bridge, copied under root at the first AttachEgress (bubblewrap_egress.go).
	bridgeBin     string
	bridgeOnce    sync.Once
	bridgeCopy    string
	bridgeDynamic bool
	bridgeErr     error

	mu    sync.Mutex
	inUse map[int]*uidClaim // host uids of live sandboxes (bubblewrap_uid.go)
}

// NewBubblewrap checks that bubblewrap can make sandboxes here and finds the resource controls
// the machine offers. A missing bwrap, or a kernel that refuses unprivileged user
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
	if err := keepInheritedOut(); err != nil {
		return nil, err
	}
	unignoreSignals()
	p := &BubblewrapProvider{
		bwrap: bwrap, log: cfg.Logger,
		asRoot: os.Geteuid() == 0, firstUID: cfg.FirstUID, uids: cfg.UIDs, uidClaims: cfg.UIDClaims, bridgeBin: cfg.BridgePath,
		inUse: map[int]*uidClaim{}, hardLimits: map[int]uint64{},
	}
	if p.root, err = prepareRoot(cfg.Root, p.asRoot); err != nil {
		return nil, err
	}
	if p.asRoot {
		if p.uidClaims, err = prepareUIDClaims(cfg.UIDClaims); err != nil {
			return nil, err
		}
	}
	for _, r := range []int{unix.RLIMIT_NPROC, unix.RLIMIT_FSIZE, unix.RLIMIT_NOFILE, unix.RLIMIT_CPU, unix.RLIMIT_CORE, unix.RLIMIT_MSGQUEUE, unix.RLIMIT_SIGPENDING, unix.RLIMIT_AS} {
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
	if !cfg.noSeccomp {
		if !bytes.Contains(help, []byte("--seccomp")) {
			return nil, fmt.Errorf("sandbox: bubblewrap: %s lacks --seccomp; install a current one with `apt-get install -y bubblewrap`: %w", bwrap, ErrUnavailable)
		}
		if p.seccomp, err = buildSeccompFilters(); err != nil {
			return nil, fmt.Errorf("sandbox: bubblewrap: %w: %w", err, ErrUnavailable)
		}
	}
	p.disableUserns = bytes.Contains(help, []byte("--disable-userns"))

	var cred *syscall.Credential
	if p.asRoot {
		cred = credential(p.firstUID)
	}
	p.hostLayout = hostLayout()
	// The probe mounts only what a sandbox mounts: binding all of / would copy every mount on
	// the host, and one that goes away meanwhile (another sandbox's workdir) fails the probe.
	probeArgs := append(append([]string{"--unshare-all", "--unshare-user"}, p.hostLayout...), "--proc", "/proc", "--", "true")
	if out, err := p.probe(cred, p.bwrap, probeArgs...); err != nil {
		return nil, fmt.Errorf("sandbox: bubblewrap cannot make namespaces here (%s): allow unprivileged user namespaces (sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1, or an AppArmor profile for bwrap): %w",
			firstLine(out, err), ErrUnavailable)
	}
	if err := p.findDiskBound(cfg); err != nil {
		return nil, err
	}
	if !cfg.DisableCgroups {
		p.cgroups = findCgroups()
	}
	if n, err := p.removeLeftovers(); err != nil {
		p.log.Warn("could not remove everything sandboxes of a stopped worker left", "removed", n, "error", err)
	} else if n > 0 {
		p.log.Warn("removed sandboxes left by a worker that stopped", "removed", n)
	}
	if err := p.removeStaleUIDClaims(); err != nil {
		p.log.Warn("could not remove every claim of a host uid that a stopped worker left", "error", err)
	}
	if n, err := p.removeStaleBridges(); err != nil {
		p.log.Warn("could not remove every copy of the egress bridge no sandbox uses", "removed", n, "error", err)
	} else if n > 0 {
		p.log.Info("removed copies of the egress bridge no sandbox uses (other worker versions')", "removed", n)
	}
	p.log.Info("bubblewrap sandboxes ready", "bwrap", bwrap, "root", p.root, "cgroup_version", p.cgroups.version,
		"cgroup_controllers", strings.Join(p.cgroups.controllers(), ","), "per_sandbox_uid", p.asRoot, "disk_bound", p.diskBoundName())
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
	cmd := exec.Command(name, args...) //nolint:noctx // bounded by probeTimeout below, see above
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := spawn.Start(cmd); err != nil {
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

// Backend names the backend.
func (p *BubblewrapProvider) Backend() string { return "bubblewrap" }

// findDiskBound decides how workdirs are bounded: by a tmpfs of their own where the worker may
// mount one, else by a walk if the operator accepts best effort, else not at all.
func (p *BubblewrapProvider) findDiskBound(cfg BubblewrapConfig) error {
	var why error
	switch {
	case cfg.noDiskMount:
		why = errors.New("turned off")
	case !p.asRoot:
		why = errors.New("the worker is not root, and only root may mount a tmpfs for each workdir")
	default:
		why = probeDiskMount(p.root)
	}
	if why == nil {
		p.diskMount = true
		return nil
	}
	if !cfg.DiskBestEffort {
		return fmt.Errorf("sandbox: bubblewrap: the kernel cannot bound workdir disk use here (%v): run the worker as root with the right to mount (CAP_SYS_ADMIN), or set sandbox.bubblewrap.disk_best_effort: true to accept a bound that files unlinked while open can exceed: %w", why, ErrUnavailable)
	}
	p.log.Warn("workdir disk bounds are best effort: the kernel cannot enforce them here, and files unlinked while open escape them", "reason", why.Error())
	return nil
}

func (p *BubblewrapProvider) diskBoundName() string {
	if p.diskMount {
		return "tmpfs"
	}
	return "best-effort"
}

// workdirMemory is what a workdir's files may add to the sandbox's memory: tmpfs pages are
// charged to the memory cgroup of whoever writes them.
func (p *BubblewrapProvider) workdirMemory(b diskBound) int64 {
	if !p.diskMount {
		return 0
	}
	return b.ceiling().bytes
}

// keepInheritedOut marks every descriptor of the worker above stderr close-on-exec. Go opens
// its own so and gives a child only its stdio and ExtraFiles, but leaves open across exec any
// descriptor the worker inherited from whatever started it (a shell, a supervisor, a CI
// runner), and bwrap passes on to the command what it does not use itself: a worker started
// with a pipe at fd 251 handed that pipe to every command of every sandbox, cold or warm
// (TestBubblewrapWorkersInheritedDescriptorsStayOut). The worker itself keeps them.
func keepInheritedOut() error {
	err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	// Before Linux 5.11: one at a time.
	fds, rerr := os.ReadDir("/proc/self/fd")
	if rerr != nil {
		return fmt.Errorf("sandbox: bubblewrap: keep the worker's inherited descriptors from the sandboxes: close_range: %w; /proc/self/fd: %w", err, rerr)
	}
	for _, e := range fds {
		fd, cerr := strconv.Atoi(e.Name())
		if cerr != nil || fd <= 2 {
			continue
		}
		// The listing's own descriptor is closed by now (EBADF): nothing to mark.
		if _, ferr := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); ferr != nil && !errors.Is(ferr, unix.EBADF) {
			return fmt.Errorf("sandbox: bubblewrap: mark fd %d close-on-exec, to keep it from the sandboxes: %w", fd, ferr)
		}
	}
	return nil
}

// ignoredSignals receives the signals unignoreSignals takes over; nothing reads it.
var ignoredSignals = make(chan os.Signal, 1)

// unignoreSignals has Go catch SIGHUP and SIGINT where the worker was started with them
// ignored (under nohup, or as a shell's background job), dropping them as the kernel did. Go
// keeps those two ignored, exec passes an ignored signal on, and neither bwrap nor the shell
// spare (a shell may not reset a signal ignored on entry) sets it back, so every sandboxed
// command had them ignored (TestBubblewrapWorkersIgnoredSignalsStayOut); a signal Go catches
// is at its default after exec, in a cold command and a warm one alike. The other signals Go
// catches from its start whatever it inherited.
func unignoreSignals() {
	for _, sig := range []os.Signal{syscall.SIGHUP, syscall.SIGINT} {
		if signal.Ignored(sig) {
			signal.Notify(ignoredSignals, sig)
		}
	}
}
