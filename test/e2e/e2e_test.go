//go:build integration

// Package e2e drives the worker and submit commands end to end through their Run functions:
// the real embedded nats-server, real bubblewrap sandboxes, the file store, and the real
// openai-go client talking to the scripted demo model (the only stand-in).
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/demomodel"
	"github.com/boxcar-run/boxcar/internal/submitcmd"
	"github.com/boxcar-run/boxcar/internal/testnet"
	"github.com/boxcar-run/boxcar/test/testworker"
)

// worker is a test worker (test/testworker) and how these tests submit to it.
type worker struct{ *testworker.Worker }

// startWorker runs `worker --embedded` in-process against a model at modelURL with the extra
// flags, waits until it is ready and stops it when the test ends.
func startWorker(t *testing.T, modelURL string, extraArgs ...string) *worker {
	t.Helper()
	return &worker{testworker.Start(t, testworker.Config{Model: modelURL, Args: extraArgs})}
}

// submit runs the submit command against w and returns its stdout, stderr and error.
func (w *worker) submit(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := submitcmd.Run(ctx, args, w.Submit.Getenv, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

func demoModel(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(demomodel.Handler())
	t.Cleanup(srv.Close)
	return srv.URL + "/v1"
}

func lastJSON(t *testing.T, stdout string) map[string]any {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	var v map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &v); err != nil {
		t.Fatalf("last line of stdout is not JSON: %v\n%s", err, stdout)
	}
	return v
}

func exitCode(err error) int {
	var e *submitcmd.ExitError
	if errors.As(err, &e) {
		return e.Code
	}
	if err != nil {
		return 1
	}
	return 0
}

func TestCSVJobEndToEnd(t *testing.T) {
	t.Parallel()
	w := startWorker(t, demoModel(t))
	stdout, stderr, err := w.submit(t, "run", "--profile", "csv-analyst", "--task", "Summarise sales.csv",
		"--input", "../../examples/sales.csv", "--wait", "--output", "json")
	if err != nil {
		t.Fatalf("submit run: %v\nstderr:\n%s", err, stderr)
	}
	res := lastJSON(t, stdout)
	if res["state"] != "succeeded" {
		t.Fatalf("state = %v, want succeeded: %v", res["state"], res)
	}
	id, _ := res["id"].(string)
	run := filepath.Join(w.DataDir, "store", "tenants", "default", "runs", id)
	files := committedFolder(t, filepath.Join(w.DataDir, "store"), id)
	report, err := os.ReadFile(filepath.Join(files, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	// 92 units in examples/sales.csv, computed by csv_stats inside the sandbox.
	if !strings.Contains(string(report), "| units | 12 | 92.00 |") {
		t.Errorf("report lacks the units figure computed by the tool:\n%s", report)
	}
	if want := "file://" + filepath.Join(files, "report.md"); res["report"] != want {
		t.Errorf("report location = %v, want %s", res["report"], want)
	}
	if _, err := os.Stat(filepath.Join(files, "transcript.jsonl")); err != nil {
		t.Errorf("store lacks the transcript of %s: %v", id, err)
	}
	// --wait reads the status every 250 ms (a tenant's identity creates no consumer), and this
	// job may end between two reads: only its end is sure to show (the steps of a longer one:
	// TestWatchShowsProgressUntilTheEnd).
	if !strings.Contains(stderr, "succeeded") {
		t.Errorf("--wait did not show the job's end:\n%s", stderr)
	}

	statusOut, _, err := w.submit(t, "status", id, "--output", "json")
	if err != nil {
		t.Fatalf("submit status: %v", err)
	}
	if st := lastJSON(t, statusOut); st["state"] != "succeeded" || st["attempt"] != float64(1) {
		t.Errorf("status = %v", st)
	}

	out := t.TempDir()
	if _, stderr, err := w.submit(t, "get", id, "--out", out); err != nil {
		t.Fatalf("submit get: %v\n%s", err, stderr)
	}
	got, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil || !bytes.Equal(got, report) {
		t.Errorf("submit get report = %q, %v; want the stored report", got, err)
	}
	for _, f := range []string{filepath.Join(files, "transcript.jsonl"), filepath.Join(run, "manifest.json")} {
		data, _ := os.ReadFile(f)
		if bytes.Contains(data, []byte("sk-e2e-secret")) {
			t.Errorf("%s contains the API key", f)
		}
	}
	if strings.Contains(w.Log.String(), "sk-e2e-secret") {
		t.Error("worker log contains the API key")
	}
}

func TestSubmitErrors(t *testing.T) {
	t.Parallel()
	w := startWorker(t, demoModel(t))
	deadAddr := testnet.ClosedAddr(t)

	tests := []struct {
		name     string
		args     []string
		nats     string
		wantCode int
		wantMsg  string
	}{
		{
			name:     "unknown profile",
			args:     []string{"run", "--profile", "no-such-profile", "--task", "x", "--wait"},
			wantCode: 4,
			wantMsg:  `unknown profile "no-such-profile"`,
		},
		{
			name:     "missing input file",
			args:     []string{"run", "--profile", "csv-analyst", "--task", "x", "--input", "does-not-exist.csv", "--wait"},
			wantCode: 1,
			wantMsg:  "does-not-exist.csv",
		},
		{
			name:     "worker not running",
			args:     []string{"run", "--profile", "csv-analyst", "--task", "x", "--wait"},
			nats:     "nats://" + deadAddr,
			wantCode: 1,
			wantMsg:  "is a worker or nats-server running",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if tt.nats != "" {
				args = append(args, "--nats", tt.nats)
			}
			start := time.Now()
			stdout, stderr, err := w.submit(t, args...)
			if code := exitCode(err); code != tt.wantCode {
				t.Fatalf("exit code = %d (%v), want %d\nstdout: %s\nstderr: %s", code, err, tt.wantCode, stdout, stderr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not say %q", err, tt.wantMsg)
			}
			if d := time.Since(start); d > 20*time.Second {
				t.Errorf("took %s; a clear error should come quickly", d)
			}
		})
	}
}
