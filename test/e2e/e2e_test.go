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
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/connflags"
	"github.com/boxcar-run/boxcar/internal/demomodel"
	"github.com/boxcar-run/boxcar/internal/submitcmd"
	"github.com/boxcar-run/boxcar/internal/testnet"
	"github.com/boxcar-run/boxcar/internal/workercmd"
)

// syncBuffer is a bytes.Buffer that a command can write while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// worker is a running embedded worker.
type worker struct {
	dataDir     string
	natsURL     string
	metricsAddr string // empty with --metrics-addr off
	log         *syncBuffer
	stopOnce    sync.Once
}

// startWorker runs `worker --embedded` in-process against a model at modelURL, and stops it when
// the test ends.
func startWorker(t *testing.T, modelURL string, extraArgs ...string) *worker {
	t.Helper()
	w := &worker{dataDir: t.TempDir(), log: &syncBuffer{}}
	env := map[string]string{"OPENAI_BASE_URL": modelURL, "OPENAI_API_KEY": "sk-e2e-secret-never-logged"}
	w.start(t, env, append([]string{"--metrics-addr", "127.0.0.1:0"}, extraArgs...))
	return w
}

// start runs `worker --embedded` on w's data dir with args through workercmd.Start, stops it
// when the test ends, and waits until it is ready: readiness and addresses come from the
// Worker, not from its log.
func (w *worker) start(t *testing.T, env map[string]string, args []string) *workercmd.Worker {
	t.Helper()
	o, err := workercmd.ParseOptions(append([]string{"--embedded", "--data-dir", w.dataDir, "--nats-listen", "127.0.0.1:0"}, args...))
	if err != nil {
		t.Fatal(err)
	}
	o.Getenv, o.Stdout, o.Stderr = mapEnv(env), &syncBuffer{}, w.log
	wk, err := workercmd.Start(context.Background(), o)
	if err != nil {
		t.Fatalf("start the worker: %v\n%s", err, w.log.String())
	}
	t.Cleanup(func() { w.stop(t, wk) })
	select {
	case <-wk.Ready():
	case <-wk.Done():
		t.Fatalf("worker exited before it was ready: %v\n%s", wk.Wait(), w.log.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("worker not ready within 60s\n%s", w.log.String())
	}
	w.natsURL, w.metricsAddr = tokenURL(t, wk.Addrs().NATS, w.dataDir), wk.Addrs().Metrics
	return wk
}

// stop drains wk, as SIGTERM does, and checks that it stops cleanly within a minute; once,
// however often it is called.
func (w *worker) stop(t *testing.T, wk *workercmd.Worker) {
	w.stopOnce.Do(func() {
		wk.Stop()
		select {
		case <-wk.Done():
			if err := wk.Wait(); err != nil && !t.Failed() {
				t.Errorf("worker stopped with %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Errorf("worker did not stop within 60s")
		}
		if t.Failed() {
			t.Logf("worker log:\n%s", w.log.String())
		}
	})
}

// logged waits for the worker's first JSON log record with message msg and returns its string
// field key: readiness and bound addresses are read from the structured log, not from text
// written for people. It returns false when exited closes first (nil: never).
func logged(t *testing.T, log *syncBuffer, msg, key string, exited <-chan struct{}) (string, bool) {
	t.Helper()
	var v string
	gone := false
	eventually(t, 60*time.Second, fmt.Sprintf("the worker logs %q with %s", msg, key), func() (bool, string) {
		var ok bool
		if v, ok = logRecord(log.String(), msg, key); ok {
			return true, ""
		}
		select {
		case <-exited:
			gone = true
			return true, ""
		default:
			return false, "log:\n" + log.String()
		}
	})
	return v, !gone
}

// logRecord returns string field key of the first JSON log record in log with message msg.
func logRecord(log, msg, key string) (string, bool) {
	for line := range strings.SplitSeq(log, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == msg {
			if v, ok := rec[key].(string); ok {
				return v, true
			}
		}
	}
	return "", false
}

// tokenURL is the embedded worker's NATS URL with the token it keeps in its data dir, for the
// raw NATS clients of the tests (submit finds the token itself through BOXCAR_HOME).
func tokenURL(t *testing.T, natsURL, dataDir string) string {
	t.Helper()
	tok, err := connflags.ReadSecretFile(filepath.Join(dataDir, connflags.EmbeddedTokenFile))
	if err != nil {
		t.Fatalf("the embedded worker's NATS token: %v", err)
	}
	return strings.Replace(natsURL, "://", "://"+tok+"@", 1)
}

func mapEnv(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// submit runs the submit command against w and returns its stdout, stderr and error.
func (w *worker) submit(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	env := mapEnv(map[string]string{"NATS_URL": w.natsURL, "BOXCAR_HOME": w.dataDir})
	err := submitcmd.Run(ctx, args, env, &stdout, &stderr)
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
	run := filepath.Join(w.dataDir, "store", "runs", id)
	files := committedFolder(t, filepath.Join(w.dataDir, "store"), id)
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
	if !strings.Contains(stderr, "tool call") {
		t.Errorf("--wait showed no progress:\n%s", stderr)
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
	if strings.Contains(w.log.String(), "sk-e2e-secret") {
		t.Error("worker log contains the API key")
	}
}

func TestSubmitErrors(t *testing.T) {
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
