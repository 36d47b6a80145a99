package storetest

import (
	"os"
	"os/exec"
	"sync"
	"testing"
)

// ReadOnly makes dir and what is under it refuse writes, as a store directory mounted
// read-only refuses the worker, until lift (or the test's end). It takes the first way the
// machine allows: immutable (chattr +i, EPERM even for root) where the file system and the
// user can; else, for a user other than root, no write permission (EACCES). Only root on a
// file system without attributes, or without CAP_LINUX_IMMUTABLE (a container's), skips the
// test: chattr alone skipped it wherever the tests ran unprivileged. (A read-only bind mount
// would not do: a store's directory handle, opened before, writes under the mount.)
func ReadOnly(t testing.TB, dir string) (lift func()) {
	t.Helper()
	var undo []string
	switch {
	case run("chattr", "-R", "+i", dir) == nil:
		undo = []string{"chattr", "-R", "-i", dir}
	case os.Geteuid() != 0 && run("chmod", "-R", "a-w", dir) == nil:
		undo = []string{"chmod", "-R", "u+w", dir}
	default:
		t.Skipf("storetest: cannot make %s read-only: chattr +i failed, and root ignores a mode", dir)
	}
	var once sync.Once
	lift = func() {
		once.Do(func() {
			if err := run(undo[0], undo[1:]...); err != nil {
				t.Errorf("storetest: undo the read-only %s: %v", dir, err)
			}
		})
	}
	t.Cleanup(lift)
	return lift
}

func run(name string, args ...string) error {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		return &exec.Error{Name: name + " " + string(out), Err: err}
	}
	return nil
}
