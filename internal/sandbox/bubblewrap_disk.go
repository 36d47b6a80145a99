package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

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

// unmountWorkdir detaches a workdir's tmpfs if one is mounted on dir; the kernel frees its
// pages once no process holds a file of it open.
func unmountWorkdir(dir string) error {
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
