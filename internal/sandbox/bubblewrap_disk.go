package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// The workdir's disk bound, enforced by the kernel: when the worker may mount (root in the
// host's mount namespace), each workdir is a tmpfs of its own, mounted at its host folder with
// size= and nr_inodes=. The kernel refuses writes past them, whatever the sandbox does: files
// unlinked while open still hold their pages, a tree nested past PATH_MAX is counted like any
// other, and empty files and folders use inodes. Its use is read with one statfs instead of a
// walk of the tree.
//
// The filesystem is a little larger than the bound (diskHeadroom): the worker still kills a
// command that takes the workdir past the bound (ErrDiskFull), as before, while the kernel's
// ceiling stops whatever a command writes between two polls. tmpfs pages live in memory and are
// charged to the sandbox's memory cgroup, so that cgroup's limit is raised by the filesystem's
// size: the profile's memory stays what its processes may use.
//
// Where no tmpfs can be mounted, the tree is walked (best effort; see DiskBestEffort), which
// cannot see unlinked open files. A walk that fails counts as over the bound.

// inodeBytes is the share of the disk bound that buys one inode: one per page, so a workdir of
// one-page files reaches both bounds together, and only empty files and folders, which use no
// pages, meet the inode bound first.
const inodeBytes = 4096

// diskBound is what a workdir may hold.
type diskBound struct {
	bytes, inodes int64
}

func newDiskBound(disk int64) diskBound {
	return diskBound{bytes: disk, inodes: max(disk/inodeBytes, 64)}
}

// ceiling is the size of the workdir's filesystem: the bound and a sixteenth (at least 1 MiB
// and 64 inodes) above it.
func (b diskBound) ceiling() diskBound {
	return diskBound{bytes: b.bytes + max(b.bytes/16, 1<<20), inodes: b.inodes + max(b.inodes/16, 64)}
}

// diskUse is what a workdir holds.
type diskUse struct {
	bytes, inodes int64
}

func (u diskUse) over(b diskBound) bool { return u.bytes > b.bytes || u.inodes > b.inodes }

// grow raises the bound to what the workdir already holds: over its bound, it may shrink but
// not grow.
func (b diskBound) grow(u diskUse) diskBound {
	return diskBound{bytes: max(b.bytes, u.bytes), inodes: max(b.inodes, u.inodes)}
}

// probeDiskMount says whether this worker can give workdirs a tmpfs of their own: it mounts
// one in root and unmounts it.
func probeDiskMount(root string) error {
	dir := filepath.Join(root, ".boxcar-probe-"+randomHex(4))
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	defer os.Remove(dir)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m,nr_inodes=64,mode=0700"); err != nil {
		return fmt.Errorf("mount tmpfs: %w", err)
	}
	return unix.Unmount(dir, unix.MNT_DETACH)
}

// mountWorkdir mounts the workdir's own tmpfs on dir, owned by uid (-1: the worker).
func mountWorkdir(dir string, b diskBound, uid int) error {
	c := b.ceiling()
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700", c.bytes, c.inodes)
	if uid >= 0 {
		opts += fmt.Sprintf(",uid=%d,gid=%d", uid, uid)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("sandbox: start: mount the workdir's tmpfs on %s: %w", dir, err)
	}
	return nil
}

// removeMount removes a sandbox's host folder, a workdir or a scratch folder, unmounting its
// tmpfs first if one is mounted there.
func removeMount(dir string) error {
	if err := unmountTmpfs(dir); err != nil {
		return err
	}
	return removeTree(dir)
}

// unmountTmpfs detaches the tmpfs mounted on dir if there is one; the kernel frees its pages
// once no process holds a file of it open.
func unmountTmpfs(dir string) error {
	mounted, err := mountinfo.Mounted(dir)
	if errors.Is(err, os.ErrNotExist) || (err == nil && !mounted) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("is %s a mount point: %w", dir, err)
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmount %s: %w", dir, err)
	}
	return nil
}

// The sandbox's scratch space, /tmp and /dev/shm, is bounded by the profile's disk too: every
// tmpfs a sandbox can write to has a size, or a command could park the host's memory in it
// where no memory cgroup counts its pages (RLIMIT_AS does not). Where the worker may mount,
// the two share one tmpfs of the worker's, <root>/<id>.scratch with a folder for each, of the
// disk bound's size= and nr_inodes=, bound into the sandbox. Elsewhere bwrap makes each a
// tmpfs of that size (bwrap's --size, 0.7 or later; bwrap sets no nr_inodes, so the kernel's
// default of half the host's pages holds), and without --size /tmp is unbounded and /dev/shm
// stays a folder of the read-only /dev. /dev itself is made read-only once /dev/shm is in
// place (bwrapArgs).
const scratchSuffix = ".scratch"

// mountScratch mounts the scratch tmpfs on dir, of b's size and inodes, owned by uid (-1: the
// worker), with its tmp and shm folders (shm sticky and open to all, as bwrap makes it).
func mountScratch(dir string, b diskBound, uid int) error {
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700", b.bytes, b.inodes)
	if uid >= 0 {
		opts += fmt.Sprintf(",uid=%d,gid=%d", uid, uid)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("sandbox: start: mount the scratch tmpfs on %s: %w", dir, err)
	}
	for _, f := range []struct {
		name string
		mode os.FileMode
	}{{"tmp", 0o755}, {"shm", 0o777 | os.ModeSticky}} {
		sub := filepath.Join(dir, f.name)
		err := os.Mkdir(sub, 0o700)
		if err == nil {
			err = os.Chmod(sub, f.mode)
		}
		if err == nil && uid >= 0 {
			err = os.Chown(sub, uid, uid)
		}
		if err != nil {
			return fmt.Errorf("sandbox: start: make the scratch folder %s: %w", sub, err)
		}
	}
	return nil
}

// scratchArgs are the bwrap options that mount /tmp and /dev/shm, as the host allows.
func (s *bubblewrapSandbox) scratchArgs(disk int64) []string {
	switch {
	case s.p.diskMount:
		return []string{"--bind", filepath.Join(s.scratchDir, "tmp"), "/tmp", "--bind", filepath.Join(s.scratchDir, "shm"), "/dev/shm"}
	case s.p.tmpSize:
		size := strconv.FormatInt(disk, 10)
		return []string{"--size", size, "--tmpfs", "/tmp", "--perms", "1777", "--size", size, "--tmpfs", "/dev/shm"}
	}
	return []string{"--tmpfs", "/tmp"}
}

// bwrap sets no nr_inodes on the /tmp and /dev/shm it makes, so the kernel's default, half the
// host's pages, holds there: empty files and folders use no pages, so size= does not stop
// them, and their inodes are kernel memory that only a memory cgroup counts (rlimits only, a
// command made 400 000 of them under a 16 MiB disk bound). A scratchWatch holds them to the
// inode bound the worker's own scratch tmpfs has (newDiskBound), each: the command's poll loop
// (watchDisk) reads both with fstatfs at every tick, and kills the command past it. Like the
// walk of the workdir, this is a poll: a command may go past the bound by what it makes in one
// interval.
type scratchWatch struct {
	bwrap int   // the command's bwrap, whose child is pid 1 of its namespaces
	fds   []int // O_PATH descriptors of its /tmp and /dev/shm, once found
	found bool
}

// inodes reads the most inodes in use on the command's /tmp or /dev/shm; ok is false until its
// mounts are in place.
func (w *scratchWatch) inodes() (most int64, ok bool) {
	if !w.found && !w.find() {
		return 0, false
	}
	for _, fd := range w.fds {
		var st unix.Statfs_t
		if unix.Fstatfs(fd, &st) == nil {
			most, ok = max(most, int64(st.Files-st.Ffree)), true
		}
	}
	return most, ok
}

// find opens the command's /tmp and /dev/shm through the root of its bwrap's child, once that
// root is the sandbox's. Until bwrap has set the mounts up, the child's root is the worker's
// own (whose /tmp and /dev/shm may be tmpfs full of the host's files) and then bwrap's staging
// tmpfs, which has neither folder: reading them counted the host's files against the command.
// The descriptors pin the mounts, so each later read is one fstatfs, whatever the pid becomes.
func (w *scratchWatch) find() bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", w.bwrap, w.bwrap))
	child, _, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
	if err != nil || child == "" {
		return false
	}
	proc, err := unix.Open("/proc/"+child, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(proc)
	root, err := unix.Openat(proc, "root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(root)
	var st, own unix.Stat_t
	if unix.Fstat(root, &st) != nil || unix.Stat("/", &own) != nil || (st.Dev == own.Dev && st.Ino == own.Ino) {
		return false
	}
	var fds []int
	for _, dir := range []string{"tmp", "dev/shm"} {
		fd, err := unix.Openat(root, dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			closeAll(fds)
			return false
		}
		fds = append(fds, fd)
	}
	w.fds, w.found = fds, true
	return true
}

// close lets the command's mounts go.
func (w *scratchWatch) close() { closeAll(w.fds) }

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// scratchError says why a command was killed for its files in /tmp or /dev/shm.
func (s *bubblewrapSandbox) scratchError() error {
	return fmt.Errorf("/tmp or /dev/shm held more than %d files and folders (one per %d bytes of the %d-byte disk bound); make fewer there: %w",
		s.disk.inodes, inodeBytes, s.disk.bytes, ErrDiskFull)
}

// scratchIsolation says how /tmp and /dev/shm are bounded, for the manifest.
func (s *bubblewrapSandbox) scratchIsolation(disk int64) string {
	switch {
	case s.p.diskMount:
		b := newDiskBound(disk)
		return fmt.Sprintf("tmp,shm=tmpfs(size=%d,nr_inodes=%d)", b.bytes, b.inodes)
	case s.p.tmpSize:
		b := newDiskBound(disk)
		return fmt.Sprintf("tmp=tmpfs(size=%d,inodes<=%d polled); shm=tmpfs(size=%d,inodes<=%d polled)", b.bytes, b.inodes, b.bytes, b.inodes)
	}
	return "tmp=tmpfs(unbounded: bwrap lacks --size); shm=none"
}

// statfsUse reads what a filesystem of the workdir's own holds.
func statfsUse(fd int) (diskUse, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return diskUse{}, err
	}
	return diskUse{
		bytes:  int64(st.Blocks-st.Bfree) * st.Bsize,
		inodes: int64(st.Files - st.Ffree),
	}, nil
}
