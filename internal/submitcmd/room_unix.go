//go:build unix

package submitcmd

import "golang.org/x/sys/unix"

// freeBytes is the space an unprivileged writer may still take on the file system of dir.
func freeBytes(dir string) (int64, bool) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return int64(st.Bavail) * int64(st.Bsize), true //nolint:unconvert // int64 on some systems, not on others
}
