package sandbox

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// gone says whether the sandbox went away from outside: its workdir's host folder removed or
// unmounted by something other than the worker (an operator's cleanup, another process
// sweeping the Root), so that the folder the worker holds is no longer the one bwrap binds
// into each command. It returns an error wrapping ErrSandboxLost then, and nil when the
// folder is there or nothing can be told (a closed sandbox: Close removes the folder itself).
func (s *bubblewrapSandbox) gone() error {
	var held, now unix.Stat_t
	if unix.Fstat(int(s.wd.fd.Fd()), &held) != nil {
		return nil
	}
	err := unix.Lstat(s.hostDir, &now)
	switch {
	case err == nil && held.Nlink > 0 && now.Dev == held.Dev && now.Ino == held.Ino:
		return nil
	case err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR):
		return nil // when in doubt, it is not lost
	}
	return fmt.Errorf("its workdir was removed from the host or unmounted, not by the worker; the job's work in it is lost: %w", ErrSandboxLost)
}

// lost is err, or the sandbox's loss when it went away (gone), before the call or during it:
// a read of a file in a removed workdir is no missing file, and a file the worker can still
// reach through its handle on an unmounted workdir is no longer the job's (no command sees
// it). A call refused because the sandbox is closed stays ErrClosed.
func (s *bubblewrapSandbox) lost(op string, err error) error {
	if errors.Is(err, ErrClosed) {
		return err
	}
	if g := s.gone(); g != nil {
		return fmt.Errorf("sandbox: %s: %w", op, g)
	}
	return err
}
