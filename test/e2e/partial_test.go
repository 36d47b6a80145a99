//go:build integration

package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/test/harness"
)

// TestOversizeReportKeepsTheRun: a job whose report is larger than the worker keeps fails with
// report_too_large, and what it did is still committed: the transcript and a manifest that
// records the failure and names no report. `submit get`, `verify` and `manifest` work on it.
func TestOversizeReportKeepsTheRun(t *testing.T) {
	t.Parallel()
	w := startWorker(t, harness.ShellModel(t), "--config", "testdata/partial.yaml")
	// A sparse 5 MiB file: over the 4 MiB limit, within the sandbox's disk bound.
	id := submitShellJob(t, w, "shell-allow", "truncate", "-s", "5M", "report.md")

	stdout, stderr, err := w.submit(t, "watch", id, "--timeout", "2m")
	if code := exitCode(err); code != 2 {
		t.Fatalf("watch: exit %d (%v), want 2 (failed)\n%s%s", code, err, stdout, stderr)
	}
	run := filepath.Join(w.DataDir, "store", "tenants", "default", "runs", id)
	if !strings.Contains(stdout, "larger than") || !strings.Contains(stdout, "manifest: file://"+filepath.Join(run, "manifest.json")) || strings.Contains(stdout, "report:") {
		t.Errorf("watch said %q; want the error and the manifest, and no report", stdout)
	}
	stdout, _, err = w.submit(t, "status", id, "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	if st := lastJSON(t, stdout); st["state"] != "failed" || st["manifest"] == nil || st["report"] != nil {
		t.Errorf("status = %v, want failed with a manifest and no report", st)
	}

	stmt := storedManifest(t, w, id)
	if got := subjectNames(stmt); !slices.Equal(got, []string{"transcript.jsonl"}) {
		t.Errorf("manifest subjects = %q, want the transcript only", got)
	}
	pred := stmt.Predicate
	if out := pred.Outcome; out.State != "failed" || out.Reason != "report_too_large" || !strings.Contains(out.Error, "larger than 4194304 bytes") {
		t.Errorf("manifest outcome = %+v, want failed, report_too_large", out)
	}
	// The allowlist, not a person, let the command run.
	if len(pred.ToolCalls) != 1 || pred.ToolCalls[0].Approval.Policy != "allowlist" || pred.ToolCalls[0].Approval.Decision != "approved" ||
		pred.ToolCalls[0].Approval.DecidedBy != "" || pred.ToolCalls[0].ExitCode != 0 {
		t.Errorf("manifest tool calls = %+v, want one shell call the allowlist approved, exit 0", pred.ToolCalls)
	}
	if _, err := os.Stat(filepath.Join(committedFolder(t, filepath.Join(w.DataDir, "store"), id), "report.md")); !os.IsNotExist(err) {
		t.Errorf("report.md in the store: %v, want none", err)
	}

	out := t.TempDir()
	stdout, stderr, err = w.submit(t, "get", id, "--out", out)
	if err != nil {
		t.Fatalf("get: %v\n%s%s", err, stdout, stderr)
	}
	for _, name := range []string{"transcript.jsonl", "manifest.json", "manifest.dsse.json"} {
		if _, err := os.Stat(filepath.Join(out, name)); err != nil {
			t.Errorf("get did not download %s: %v", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "report.md")); !os.IsNotExist(err) {
		t.Errorf("get downloaded a report: %v", err)
	}

	stdout, stderr, err = w.submit(t, "verify", id)
	if err != nil {
		t.Fatalf("verify: %v\n%s%s", err, stdout, stderr)
	}
	if !regexp.MustCompile(`(?m)^\s+ok\s+transcript.jsonl`).MatchString(stdout) || strings.Contains(stdout, "report.md") {
		t.Errorf("verify said:\n%s\nwant the transcript checked and no report", stdout)
	}
	stdout, _, err = w.submit(t, "manifest", id)
	if err != nil || !strings.Contains(stdout, "outcome:   failed (report_too_large)") || !strings.Contains(stdout, "approved (policy allowlist)") ||
		!strings.Contains(stdout, "seccomp:   boxcar-") {
		t.Errorf("submit manifest = %q, %v; want the reason, the policy's decision and the seccomp filter", stdout, err)
	}
}
