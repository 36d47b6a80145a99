//go:build integration

package runner_test

import (
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestSandboxStartFailureNamesNoHostPath: a job whose sandbox real bubblewrap cannot start (its
// profile's image folder was removed from the host) is retried and ends dead, and what its
// tenant reads of it (every status `submit status` and `watch` show, the dead letter, the
// manifest and the transcript line it commits) names neither the image's path nor the worker's
// sandbox root: the sandbox's words go to the worker's log, on a line with the job's id and
// tenant.
func TestSandboxStartFailureNamesNoHostPath(t *testing.T) {
	t.Parallel()
	b := setup(t)
	image := sandboxtest.SearchableTempDir(t) + "/rootfs"
	if err := os.MkdirAll(image+"/bin", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(image); err != nil { // removed after the profile named it
		t.Fatal(err)
	}
	p := b.cfg.Profiles["p"]
	p.Sandbox.Image = image
	b.cfg.Profiles["p"] = p
	var root string
	bw := sandboxtest.Bubblewrap(t, func(c *sandbox.BubblewrapConfig) { root = c.Root })
	var logs harness.LogBuffer
	b.worker(agentFunc(writeReport), func(c *runner.Config) {
		c.Sandboxes, c.Logger = bw, slog.New(slog.NewJSONHandler(&logs, nil))
	})
	j := b.submit("p")
	seen := b.statusesUntilFinal(j.ID, time.Minute)
	hostPaths{image, root}.notIn(t, seen...)
	hostPaths{image, root}.inALogLine(t, logs.String(), j.ID, "default")
}
