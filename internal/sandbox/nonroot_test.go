//go:build integration

package sandbox_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// A worker that is not root runs its sandboxes as its own uid, mounts nothing and has no
// cgroup: its bounds are rlimits and the worker's polls alone. The tests run as root, so a
// test of that worker runs again as an unprivileged uid, in a copy of the test binary.
const (
	nonRootWorkerEnv = "BOXCAR_TEST_NONROOT_WORKER" // set in the copy: the test is the worker
	nonRootUID       = 65534                        // nobody
)

// asNonRootWorker runs the calling top-level test again as uid nonRootUID and fails it if that
// run fails or runs nothing. It is true in that run, where the test does its work, and false in
// the test's own run once the other passed.
func asNonRootWorker(t *testing.T) bool {
	t.Helper()
	if os.Getenv(nonRootWorkerEnv) != "" {
		if os.Geteuid() == 0 || os.Getuid() == 0 {
			t.Fatalf("the non-root worker's run has uid %d, euid %d", os.Getuid(), os.Geteuid())
		}
		return true
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// cp(1), not a write of the test process: a parallel test's fork would hold a written
	// file open until its child execs ("text file busy").
	bin := filepath.Join(sandboxtest.SearchableTempDir(t), "sandbox.test")
	if out, err := exec.CommandContext(t.Context(), "cp", self, bin).CombinedOutput(); err != nil {
		t.Fatalf("copy the test binary: %v: %s", err, out)
	}
	tmp := t.TempDir()
	for _, err := range []error{os.Chmod(bin, 0o755), os.Chown(tmp, nonRootUID, nonRootUID)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.CommandContext(t.Context(), bin, "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.v", "-test.count=1")
	cmd.Env = []string{nonRootWorkerEnv + "=1", "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + tmp, "TMPDIR=" + tmp}
	cmd.Dir = tmp
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nonRootUID, Gid: nonRootUID, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	t.Logf("as uid %d:\n%s", nonRootUID, out)
	if err != nil {
		t.Fatalf("the test failed as a worker of uid %d: %v", nonRootUID, err)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()+" ") {
		t.Fatalf("the test did not run as a worker of uid %d", nonRootUID)
	}
	return false
}
