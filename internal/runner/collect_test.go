//go:build integration

package runner_test

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// withBubblewrap runs the worker's sandboxes in real bubblewrap.
func withBubblewrap(t *testing.T) func(*runner.Config) {
	p := sandboxtest.Bubblewrap(t)
	return func(c *runner.Config) { c.Sandboxes = p }
}

// shellAgent runs script with sh in the sandbox, as a model's tool call would, and then
// finishes with finalMessage.
func shellAgent(script, finalMessage string, ran *atomic.Int64) agentFunc {
	return func(ctx context.Context, req agent.Request) (agent.Result, error) {
		ran.Add(1)
		res, err := req.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: time.Minute})
		if err != nil {
			return agent.Result{}, err
		}
		if res.ExitCode != 0 {
			return agent.Result{}, &scriptError{stderr: string(res.Stderr)}
		}
		return agent.Result{Outcome: agent.OutcomeCompleted, FinalMessage: finalMessage}, nil
	}
}

type scriptError struct{ stderr string }

func (e *scriptError) Error() string { return "the test's script failed: " + e.stderr }

// deepTree nests folders in artifacts/ past PATH_MAX (25 levels of 200 bytes), with a file at
// the bottom, beside a file the collection must still take.
const deepTree = `mkdir -p artifacts && echo ok > artifacts/ok.txt && cd artifacts && python3 -c '
import os
for _ in range(25):
    os.mkdir("d" * 200)
    os.chdir("d" * 200)
open("deep.txt", "w").write("deep")'`

// TestHostileWorkdirNeverLosesTheRun: whatever shape a job leaves its report or artifact folder
// in, in a real bubblewrap sandbox, the run is committed once with its transcript and a
// manifest that verifies: a report that is not a regular file inside the workdir gives way to
// the model's final message, recorded as report_unreadable; a folder that cannot be read is
// left out and named.
func TestHostileWorkdirNeverLosesTheRun(t *testing.T) {
	t.Parallel()
	const final = "the model's final answer"
	tests := []struct {
		name       string
		script     string
		wantReport string // report.md as committed
		wantReason string // collected.report_reason
		wantFiles  []string
		// wantSkipped is path prefix:reason detail of what the manifest names as left out.
		wantSkipped []string
	}{
		{name: "report is a symlink leading out", script: "ln -s /etc/passwd report.md", wantReport: final, wantReason: "report_unreadable"},
		{name: "report is a FIFO", script: "mkfifo report.md", wantReport: final, wantReason: "report_unreadable"},
		{name: "report is a socket", script: `python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind("report.md")'`, wantReport: final, wantReason: "report_unreadable"},
		{name: "report links to a device", script: "ln -s /dev/zero report.md", wantReport: final, wantReason: "report_unreadable"},
		{name: "report is a folder", script: "mkdir report.md && echo x > report.md/x", wantReport: final, wantReason: "report_unreadable"},
		{name: "report is a symlink loop", script: "ln -s report.md report.md", wantReport: final, wantReason: "report_unreadable"},
		{name: "report links to a link leading out", script: "ln -s /etc/hostname h && ln -s h report.md", wantReport: final, wantReason: "report_unreadable"},
		{
			name:        "artifacts nested past PATH_MAX",
			script:      "echo '# mine' > report.md && " + deepTree,
			wantReport:  "# mine\n",
			wantFiles:   []string{"artifacts/ok.txt"},
			wantSkipped: []string{"artifacts/dddd:nested past PATH_MAX"},
		},
		{
			name:        "artifact folder is a symlink leading out",
			script:      "echo '# mine' > report.md && ln -s /etc artifacts",
			wantReport:  "# mine\n",
			wantSkipped: []string{"artifacts:a link out of the workdir"},
		},
		{
			name:        "artifact folder is a symlink loop",
			script:      "echo '# mine' > report.md && ln -s artifacts artifacts",
			wantReport:  "# mine\n",
			wantSkipped: []string{"artifacts:"},
		},
		{
			name:       "artifacts hold a loop and a FIFO",
			script:     "echo '# mine' > report.md && mkdir artifacts && ln -s . artifacts/loop && mkfifo artifacts/fifo && echo ok > artifacts/ok.txt",
			wantReport: "# mine\n",
			wantFiles:  []string{"artifacts/ok.txt"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := setup(t)
			var ran atomic.Int64
			b.worker(shellAgent(tt.script, final, &ran), withBubblewrap(t))
			j := b.submit("p")
			st := b.waitFinal(j.ID, time.Minute)
			if st.State != job.StateSucceeded || st.Manifest == "" || st.Report == "" {
				t.Fatalf("status = %+v, want succeeded with a manifest and a report", st)
			}
			if n := ran.Load(); n != 1 {
				t.Errorf("the job ran %d times, want once", n)
			}
			if got := string(b.runFile(j.ID, "report.md")); got != tt.wantReport {
				t.Errorf("report.md = %q, want %q", got, tt.wantReport)
			}
			m := b.manifest(j.ID)
			var names []string
			for _, s := range m.Subjects {
				if s.Name != "report.md" && s.Name != "transcript.jsonl" {
					names = append(names, s.Name)
				}
			}
			if !slices.Equal(names, tt.wantFiles) {
				t.Errorf("artifacts committed = %q, want %q", names, tt.wantFiles)
			}
			// The manifest's sandbox names the syscall filter the job's commands ran under.
			if sb := m.Predicate.Sandbox; sb.Seccomp == "" || !strings.HasPrefix(sb.SeccompDigest, "sha256:") {
				t.Errorf("manifest sandbox = %+v, want the seccomp filter and its digest", sb)
			}
			c := m.Predicate.Collected
			if c.ReportReason != tt.wantReason {
				t.Errorf("collected = %+v, want report reason %q", c, tt.wantReason)
			}
			if tt.wantReason != "" && (c.Report != "final_message" || c.ReportError == "") {
				t.Errorf("collected = %+v, want the final message as the report and the error that explains why", c)
			}
			var skipped []string
			for _, s := range c.Skipped {
				skipped = append(skipped, s.Path+":"+s.Detail)
			}
			if len(skipped) != len(tt.wantSkipped) {
				t.Errorf("left out = %q, want %q", skipped, tt.wantSkipped)
			}
			for i := range min(len(skipped), len(tt.wantSkipped)) {
				path, detail, _ := strings.Cut(tt.wantSkipped[i], ":")
				if s := c.Skipped[i]; !strings.HasPrefix(s.Path, path) || !strings.Contains(s.Detail, detail) || len(s.Path) > 300 {
					t.Errorf("left out %q (%s), want %s… (%s), named in at most 300 bytes", s.Path, s.Detail, path, detail)
				}
			}
			if report, err := provenance.Verify(t.Context(), b.store, j.ID, nil); err != nil || !report.OK() {
				t.Errorf("verify: %v %+v", err, report.Checks)
			}
			if dls := b.settledLetters(); len(dls) != 0 {
				t.Errorf("dead letters = %+v, want none", dls)
			}
		})
	}
}
