package harness_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/test/harness"
)

func TestPoll(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cond    func(calls int) (bool, error)
		timeout time.Duration
		wantErr []string // substrings; none: success
	}{
		{name: "holds at the third call", cond: func(n int) (bool, error) { return n == 3, errors.New("not yet") }, timeout: time.Minute},
		{name: "times out with the last state", cond: func(n int) (bool, error) { return false, fmt.Errorf("state %d", n) },
			timeout: 50 * time.Millisecond, wantErr: []string{"the thing: ", "deadline exceeded", "last: state "}},
		{name: "stops at once", cond: func(n int) (bool, error) { return false, fmt.Errorf("%w: it exited", harness.ErrStop) },
			timeout: time.Hour, wantErr: []string{"the thing: stop waiting: it exited"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			calls := 0
			err := harness.Poll(t.Context(), tt.timeout, "the thing", func(context.Context) (bool, error) {
				calls++
				return tt.cond(calls)
			})
			if len(tt.wantErr) == 0 {
				if err != nil || calls != 3 {
					t.Errorf("Poll = %v after %d calls, want nil after 3", err, calls)
				}
				return
			}
			for _, w := range tt.wantErr {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("Poll = %v, want an error with %q", err, w)
				}
			}
		})
	}
}

// TestPollEndsWithItsContext: a wait with no timeout of its own ends with its context.
func TestPollEndsWithItsContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := harness.Poll(ctx, 0, "nothing", func(context.Context) (bool, error) { return false, nil })
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Poll = %v, want context.Canceled", err)
	}
}

func TestScaleAtLeastOne(t *testing.T) {
	t.Parallel()
	if s := harness.Scale(); s < 1 && os.Getenv(harness.ScaleEnv) == "" {
		t.Errorf("Scale() = %v without %s, want at least 1", s, harness.ScaleEnv)
	}
	if got := harness.Timeout(time.Second); got != time.Duration(float64(time.Second)*harness.Scale()) {
		t.Errorf("Timeout(1s) = %s with scale %v", got, harness.Scale())
	}
}

func TestLogBufferRecord(t *testing.T) {
	t.Parallel()
	var b harness.LogBuffer
	fmt.Fprintln(&b, `{"msg":"other","addr":"x"}`)
	fmt.Fprintln(&b, `not json`)
	fmt.Fprintln(&b, `{"msg":"metrics listening","addr":"127.0.0.1:9"}`)
	if v, ok := b.Record("metrics listening", "addr"); !ok || v != "127.0.0.1:9" {
		t.Errorf("Record = %q, %v", v, ok)
	}
	if _, ok := b.Record("absent", "addr"); ok {
		t.Error("Record found a message that was never written")
	}
}

// TestProcessReadyFile: a child process is ready once its ready file holds its addresses, and
// a wait for one that exits first ends at once with how it ended.
func TestProcessReadyFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready.json")
	// sh stands in for a worker: "$2" is the ready file Start passes after --ready-file.
	p := &harness.Process{Name: "stand-in", Path: "/bin/sh", Log: filepath.Join(dir, "log"), ReadyFile: ready,
		Args: []string{"-c", `sleep 0.2; echo '{"nats":"nats://127.0.0.1:1","store":"file:///x"}' > "$2.tmp" && mv "$2.tmp" "$2"; sleep 60`, "sh"}}
	if err := p.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(5 * time.Second) })
	a, err := p.WaitReady(t.Context(), time.Minute)
	if err != nil || a.NATS != "nats://127.0.0.1:1" || a.Store != "file:///x" {
		t.Errorf("WaitReady = %+v, %v", a, err)
	}

	q := &harness.Process{Name: "quitter", Path: "/bin/sh", Args: []string{"-c", "exit 3"}, Log: filepath.Join(dir, "log2"), ReadyFile: filepath.Join(dir, "never.json")}
	if err := q.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := q.WaitReady(t.Context(), time.Hour); err == nil || !strings.Contains(err.Error(), "quitter exited: exit status 3") {
		t.Errorf("WaitReady of a process that exits = %v, want how it exited", err)
	}
}

// TestProcessTree: a child this process started is in its tree, with this process as its
// parent in its stat; a process that is gone has no stat.
func TestProcessTree(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("/bin/sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	child := cmd.Process.Pid
	tree := harness.ProcessTree(os.Getpid())
	if tree[0] != os.Getpid() || !slices.Contains(tree, child) {
		t.Errorf("ProcessTree = %v, want %d first and its child %d in it", tree, os.Getpid(), child)
	}
	if st := harness.ProcStat(child); len(st) < 20 || st[1] != strconv.Itoa(os.Getpid()) {
		t.Errorf("ProcStat of the child = %q, want its parent %d at [1]", st, os.Getpid())
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if st := harness.ProcStat(child); st != nil {
		t.Errorf("ProcStat of a reaped child = %q, want nil", st)
	}
}
