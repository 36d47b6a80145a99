package sandbox_test

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// TestBubblewrapWorkdirRemovedIsLost: a sandbox whose workdir is removed from the host under
// the job (unmounted and deleted by something other than the worker) is lost: every call
// says so, rather than a missing report, an empty artifact folder or a command that "could not
// run".
func TestBubblewrapWorkdirRemovedIsLost(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit []func(*sandbox.BubblewrapConfig)
	}{
		{name: "workdir on its own tmpfs"},
		{name: "workdir a plain folder", edit: []func(*sandbox.BubblewrapConfig){sandbox.WithoutDiskMount}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sb := sandboxtest.Start(t, sandboxtest.Bubblewrap(t, tt.edit...))
			dir := sandbox.BubblewrapHostState(sb).Dir
			sandboxtest.RunLost(t, sb, func(t *testing.T) {
				if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && err != unix.EINVAL {
					t.Fatal(err)
				}
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
			}, false)
		})
	}
}
