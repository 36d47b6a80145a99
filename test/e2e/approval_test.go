//go:build integration

package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/test/harness"
)

// submitShellJob submits a job whose task names argv, and returns its id.
func submitShellJob(t *testing.T, w *worker, profile string, argv ...string) string {
	t.Helper()
	cmd, _ := json.Marshal(argv)
	stdout, stderr, err := w.submit(t, "run", "--profile", profile, "--task", "Run this.\nRUN: "+string(cmd), "--output", "json")
	if err != nil {
		t.Fatalf("submit run: %v\n%s", err, stderr)
	}
	return lastJSON(t, stdout)["id"].(string)
}

// pendingApproval is one entry of `submit approvals --output json`.
type pendingApproval struct {
	JobID       string    `json:"job_id"`
	CallID      string    `json:"call_id"`
	Argv        []string  `json:"argv"`
	RequestedAt time.Time `json:"requested_at"`
	ExpiresAt   time.Time `json:"expires_at"`
}

// waitForApproval polls `submit approvals JOB_ID` until the job's request shows up.
func waitForApproval(t *testing.T, w *worker, id string) pendingApproval {
	t.Helper()
	var p pendingApproval
	harness.Wait(t, "job "+id+" asks for an approval", func() (bool, error) {
		stdout, stderr, err := w.submit(t, "approvals", id, "--output", "json")
		if err != nil {
			t.Fatalf("submit approvals: %v\n%s", err, stderr)
		}
		var list struct {
			Approvals []pendingApproval `json:"approvals"`
		}
		if err := json.Unmarshal([]byte(stdout), &list); err != nil {
			t.Fatalf("submit approvals --output json: %v\n%s", err, stdout)
		}
		if len(list.Approvals) == 0 {
			return false, errors.New(stdout)
		}
		p = list.Approvals[0]
		return true, nil
	})
	return p
}

// finish follows a job to its end and returns the final status.
func finish(t *testing.T, w *worker, id string) map[string]any {
	t.Helper()
	stdout, stderr, err := w.submit(t, "watch", id, "--output", "json", "--timeout", "2m")
	if code := exitCode(err); code != 0 {
		t.Fatalf("watch: exit %d, %v\n%s", code, err, stderr)
	}
	return lastJSON(t, stdout)
}

// shellLine returns the transcript line of the shell call and the report of a run.
func shellLine(t *testing.T, w *worker, id string) (map[string]any, string) {
	t.Helper()
	run := committedFolder(t, filepath.Join(w.DataDir, "store"), id)
	report, err := os.ReadFile(filepath.Join(run, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	transcript, err := os.ReadFile(filepath.Join(run, "transcript.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range bytes.Split(bytes.TrimSpace(transcript), []byte("\n")) {
		var v map[string]any
		if err := json.Unmarshal(l, &v); err != nil {
			t.Fatalf("transcript line: %v", err)
		}
		if v["type"] == "tool_call" && v["tool"] == "shell" {
			return v, string(report)
		}
	}
	t.Fatalf("the transcript of %s has no shell call:\n%s", id, transcript)
	return nil, ""
}

// person is who decided in the manifest when this test runs `submit approve` and `submit
// deny`: the name of the approver key in the worker's keyring, for the embedded worker its own
// key "local", whatever the answer claims.
func person(*testing.T) string { return "local" }

// shellApproval returns the manifest's record of how the run's one shell call was decided.
func shellApproval(t *testing.T, w *worker, id string) provenance.Approval {
	t.Helper()
	calls := storedManifest(t, w, id).Predicate.ToolCalls
	if len(calls) != 1 || calls[0].Tool != "shell" || calls[0].ID != harness.ShellCallID {
		t.Fatalf("manifest tool calls = %+v, want the one shell call", calls)
	}
	return calls[0].Approval
}

// TestApprovals runs the "ask" policy end to end: the worker publishes the command and waits,
// a person answers with submit, and the answer decides whether the command runs in the sandbox.
func TestApprovals(t *testing.T) {
	t.Parallel()
	w := startWorker(t, harness.ShellModel(t), "--config", "testdata/approvals.yaml")

	t.Run("approve", func(t *testing.T) {
		id := submitShellJob(t, w, "shell-ask", "echo", "hello from the sandbox")
		p := waitForApproval(t, w, id)
		if p.CallID != harness.ShellCallID || !reflect.DeepEqual(p.Argv, []string{"echo", "hello from the sandbox"}) {
			t.Fatalf("pending request = %+v", p)
		}
		if left := time.Until(p.ExpiresAt); left < 50*time.Second || left > 61*time.Second {
			t.Errorf("the request expires in %s, want the profile's 60s", left)
		}
		// The request is listed before the status says so: wait for the status.
		var waiting map[string]any
		harness.Wait(t, "job "+id+" is waiting_approval", func() (bool, error) {
			stdout, _, err := w.submit(t, "status", id, "--output", "json")
			if err != nil {
				return false, err
			}
			waiting = lastJSON(t, stdout)
			return waiting["state"] == "waiting_approval", fmt.Errorf("status %v", waiting)
		})
		if !strings.Contains(fmt.Sprint(waiting["progress"]), "submit approve "+id+" "+harness.ShellCallID) {
			t.Errorf("status while waiting = %v, want waiting_approval saying how to answer", waiting)
		}
		text, _, err := w.submit(t, "approvals")
		if err != nil || !strings.Contains(text, id) || !strings.Contains(text, `["echo","hello from the sandbox"]`) {
			t.Errorf("submit approvals = %q, %v; want the job and the command", text, err)
		}

		// Wait past the consumer's ack_wait (5s): only the heartbeats keep the job this worker's.
		time.Sleep(time.Until(p.RequestedAt.Add(6 * time.Second)))
		stdout, stderr, err := w.submit(t, "approve", id, harness.ShellCallID, "--yes")
		if err != nil {
			t.Fatalf("approve: %v\n%s", err, stderr)
		}
		if !strings.Contains(stdout, "approved call "+harness.ShellCallID+" of job "+id) {
			t.Errorf("approve said %q", stdout)
		}
		for _, again := range [][]string{{"approve", id, harness.ShellCallID}, {"deny", id, harness.ShellCallID}} {
			_, _, err := w.submit(t, again...)
			if exitCode(err) != 1 || !strings.Contains(fmt.Sprint(err), "already approved by") {
				t.Errorf("%s after the answer: %v, want a refusal naming the first answer", again[0], err)
			}
		}

		st := finish(t, w, id)
		if st["state"] != "succeeded" || st["attempt"] != 1.0 {
			t.Errorf("final status = %v, want succeeded in attempt 1 (no redelivery while waiting)", st)
		}
		line, report := shellLine(t, w, id)
		if !strings.Contains(report, `hello from the sandbox\n`) || !strings.Contains(report, `"exit_code":0`) {
			t.Errorf("report = %q, want the command's output", report)
		}
		if wait, _ := line["approval_ms"].(float64); line["exit_code"] != 0.0 || wait < 2500 || line["exec_ms"] == nil {
			t.Errorf("transcript shell line = %v, want exit 0, approval_ms ≥ 2500 and exec_ms", line)
		}
		// The manifest says a person let the command through, who, and when (after the wait).
		a := shellApproval(t, w, id)
		if a.Policy != "ask" || a.Decision != "approved" || a.DecidedBy != person(t) || a.DecidedAt.Sub(p.RequestedAt) < 3*time.Second {
			t.Errorf("manifest approval = %+v, want ask, approved by %s at least 3s after %s", a, person(t), p.RequestedAt)
		}
	})

	t.Run("deny", func(t *testing.T) {
		id := submitShellJob(t, w, "shell-ask", "touch", "denied.txt")
		p := waitForApproval(t, w, id)
		_, stderr, err := w.submit(t, "deny", id, harness.ShellCallID, "--yes", "--reason", "not on a Friday")
		if err != nil {
			t.Fatalf("deny: %v\n%s", err, stderr)
		}
		if _, _, err := w.submit(t, "approve", id, harness.ShellCallID, "--yes"); !strings.Contains(fmt.Sprint(err), "already denied by") {
			t.Errorf("approve after deny: %v, want a refusal", err)
		}
		if st := finish(t, w, id); st["state"] != "succeeded" {
			t.Errorf("final status = %v, want succeeded: a refusal is data for the model", st)
		}
		line, report := shellLine(t, w, id)
		const want = "refused: a person denied the command: not on a Friday"
		if line["error"] != want || line["exec_ms"] != nil || !strings.Contains(report, want) {
			t.Errorf("transcript shell line %v, report %q; want %q and nothing run", line, report, want)
		}
		if a := shellApproval(t, w, id); a.Policy != "ask" || a.Decision != "denied" || a.DecidedBy != person(t) || a.DecidedAt.Before(p.RequestedAt) {
			t.Errorf("manifest approval = %+v, want ask, denied by %s after %s", a, person(t), p.RequestedAt)
		}
	})

	t.Run("no answer in time", func(t *testing.T) {
		id := submitShellJob(t, w, "shell-ask-short", "echo", "too late")
		st := finish(t, w, id)
		if st["state"] != "succeeded" {
			t.Errorf("final status = %v, want succeeded", st)
		}
		line, report := shellLine(t, w, id)
		const want = "refused: no approval within 1s"
		if line["error"] != want || line["exec_ms"] != nil || !strings.Contains(report, want) {
			t.Errorf("transcript shell line %v, report %q; want %q and nothing run", line, report, want)
		}
		// Nobody is named: the worker gave up waiting.
		if a := shellApproval(t, w, id); a.Policy != "ask" || a.Decision != "timed_out" || a.DecidedBy != "" || a.DecidedAt.IsZero() {
			t.Errorf("manifest approval = %+v, want ask, timed_out, nobody, and when", a)
		}
		_, _, err := w.submit(t, "approve", id, harness.ShellCallID, "--yes")
		if exitCode(err) != 1 || !strings.Contains(fmt.Sprint(err), "expired") || !strings.Contains(fmt.Sprint(err), "no answer within 1s") {
			t.Errorf("approve after expiry: %v, want a refusal saying it expired", err)
		}
		if stdout, _, err := w.submit(t, "approvals", id); err != nil || !strings.Contains(stdout, "no commands are waiting") {
			t.Errorf("approvals after expiry = %q, %v; want none", stdout, err)
		}
	})

	t.Run("unknown request", func(t *testing.T) {
		_, _, err := w.submit(t, "approve", "20261202t101500-0a1b2c3d4e5f", "call_nope", "--yes")
		if exitCode(err) != 1 || !strings.Contains(fmt.Sprint(err), "no such approval request") {
			t.Errorf("approve of nothing: %v", err)
		}
		if _, _, err := w.submit(t, "deny", "20261202t101500-0a1b2c3d4e5f"); exitCode(err) != 1 || !strings.Contains(fmt.Sprint(err), "JOB_ID and CALL_ID") {
			t.Errorf("deny without a call id: %v", err)
		}
	})
}
