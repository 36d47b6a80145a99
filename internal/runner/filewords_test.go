package runner_test

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestManifestFileReasonsNameNoHost: why the manifest says a file of the job was left out (the
// report unreadable, the artifact folder unlisted, an artifact failing its upload) is fixed
// words per class: the tenant's own file errors (permission denied, a name too long, a loop of
// links) by their class, and a failure of the sandbox's transport in words that name nothing of
// the worker's side, its detail in the worker's log under the job's id. The sandbox's own text
// went into the manifest: a Kubernetes exec failure names the pod and the node's address.
func TestManifestFileReasonsNameNoHost(t *testing.T) {
	t.Parallel()
	const pod, node = "boxcar-job-7f3a", "10.0.0.7:10250"
	errs := []struct {
		name string
		err  error
		want string
	}{
		{"transport", fmt.Errorf("sandbox: read: error dialing backend: dial tcp %s: pod %s: connection reset by peer", node, pod),
			"could not be read on the worker's side"},
		{"permission", &fs.PathError{Op: "openat", Path: "/var/lib/boxcar/" + pod + "/work/x", Err: syscall.EACCES}, "permission denied"},
		{"name too long", &fs.PathError{Op: "openat", Path: "/var/lib/boxcar/" + pod + "/work/x", Err: syscall.ENAMETOOLONG}, "name too long"},
		{"loop", &fs.PathError{Op: "openat", Path: "/var/lib/boxcar/" + pod + "/work/x", Err: syscall.ELOOP}, "too many levels of symbolic links"},
		{"a FIFO", fmt.Errorf("sandbox: read /var/lib/boxcar/%s/work/x: %w", pod, sandbox.ErrNotRegular), "not a regular file"},
	}
	for _, site := range []struct {
		name string
		arm  func(c *runner.Config, failing *atomic.Pointer[error])
		got  func(c provenance.Collected) string
	}{
		{"report", func(c *runner.Config, failing *atomic.Pointer[error]) {
			c.Sandboxes.(*fakeProvider).readFails = func(name string) error {
				if name == "report.md" {
					return *failing.Load()
				}
				return nil
			}
		}, func(c provenance.Collected) string { return c.ReportError }},
		{"artifact folder", func(c *runner.Config, failing *atomic.Pointer[error]) {
			c.Sandboxes.(*fakeProvider).listFails = func(string) error { return *failing.Load() }
		}, skippedDetail},
		{"artifact upload", func(c *runner.Config, failing *atomic.Pointer[error]) {
			c.Sandboxes.(*fakeProvider).reads = func(_ context.Context, name string, data []byte) io.Reader {
				if strings.HasSuffix(name, "table.csv") {
					return iotest.ErrReader(*failing.Load())
				}
				return strings.NewReader(string(data))
			}
		}, skippedDetail},
	} {
		t.Run(site.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var logs harness.LogBuffer
			var failing atomic.Pointer[error]
			failing.Store(&errs[0].err)
			b.worker(agentFunc(writeReport), func(c *runner.Config) {
				c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
				site.arm(c, &failing)
			})
			for _, e := range errs {
				failing.Store(&e.err)
				j := b.submit("p")
				if st := b.waitFinal(j.ID, 10*time.Second); st.State != job.StateSucceeded {
					t.Fatalf("%s: status = %+v, want succeeded", e.name, st)
				}
				got := site.got(b.manifest(j.ID).Predicate.Collected)
				if !strings.Contains(got, e.want) || strings.Contains(got, pod) || strings.Contains(got, node) {
					t.Errorf("%s: the manifest says %q; want %q, naming neither the pod nor the node", e.name, got, e.want)
				}
			}
			if !strings.Contains(logs.String(), node) {
				t.Errorf("the worker's log lacks the transport's detail:\n%s", logs.String())
			}
		})
	}
}

// skippedDetail is the detail of the first file or folder the manifest says was left out.
func skippedDetail(c provenance.Collected) string {
	if len(c.Skipped) == 0 {
		return ""
	}
	return c.Skipped[0].Detail
}
