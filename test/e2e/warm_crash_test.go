//go:build integration

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/demomodel"
	"github.com/boxcar-run/boxcar/internal/workercmd"
	"github.com/boxcar-run/boxcar/test/harness"
)

// workerProcessEnv makes the test binary a worker process (workercmd, as cmd/worker's main
// runs it), so that a test can SIGKILL a real worker without building one inside a test.
const workerProcessEnv = "BOXCAR_E2E_WORKER_PROCESS"

// The re-executed test binary becomes the worker before any test runs.
func init() {
	if os.Getenv(workerProcessEnv) == "1" {
		os.Exit(runWorkerProcess())
	}
}

func runWorkerProcess() int {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() { <-sigs; cancel() }()
	if err := workercmd.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	return 0
}

// startWorkerProcess starts the test binary as a worker with the config file, and waits until
// it takes jobs; it is stopped with SIGTERM when the test ends, unless killed before.
func startWorkerProcess(t *testing.T, name, config, modelURL string) (*harness.Process, harness.Addrs) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	w := &harness.Process{Name: name, Path: self, Args: []string{"--config", config, "--metrics-addr", "127.0.0.1:0"},
		Env: []string{workerProcessEnv + "=1", "OPENAI_BASE_URL=" + modelURL, "OPENAI_API_KEY=sk-test"},
		Log: filepath.Join(dir, "worker.log"), ReadyFile: filepath.Join(dir, "ready.json")}
	if err := w.Start(context.WithoutCancel(t.Context())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(time.Minute) })
	addrs, err := w.WaitReady(t.Context(), harness.DefaultTimeout)
	if err != nil {
		log, _ := os.ReadFile(w.Log)
		t.Fatalf("%v\n%s", err, log)
	}
	return w, addrs
}

// hangingModel is the scripted demo model, but for the first job's second request, which it
// holds until the worker goes away: that job runs, its sandbox taken, for as long as the test
// needs.
type hangingModel struct {
	url  string
	hung chan struct{}
	once sync.Once
}

func newHangingModel(t *testing.T) *hangingModel {
	t.Helper()
	m := &hangingModel{hung: make(chan struct{})}
	srv := httptest.NewServer(demomodel.HandlerWith(demomodel.Options{Hold: func(r *http.Request, turn int, _ []byte) {
		first := false
		if turn > 1 {
			m.once.Do(func() { first = true; close(m.hung) })
		}
		if first {
			<-r.Context().Done() // until the worker goes away
		}
	}}))
	t.Cleanup(srv.Close)
	m.url = srv.URL + "/v1"
	return m
}

// hostLeftovers is what a worker's sandboxes hold on the host: their paths under the Root
// (lock file, workdir, scratch and egress folders), their cgroups, and the processes of the
// worker's tree (each with its start time, so that a reused pid is not taken for it).
type hostLeftovers struct {
	paths []string
	procs map[int]string // pid: start time
}

func snapshotSandboxes(t *testing.T, root string, workerPid int) hostLeftovers {
	t.Helper()
	var h hostLeftovers
	locks, err := filepath.Glob(filepath.Join(root, "boxcar-*.lock"))
	if err != nil {
		t.Fatal(err)
	}
	for _, lock := range locks {
		dir := strings.TrimSuffix(lock, ".lock")
		h.paths = append(h.paths, lock, dir, dir+".scratch", dir+".egress")
		data, err := os.ReadFile(lock)
		if err != nil {
			t.Fatal(err)
		}
		for l := range strings.Lines(string(data)) {
			if cg, ok := strings.CutPrefix(strings.TrimSpace(l), "cgroup "); ok {
				h.paths = append(h.paths, cg)
			}
		}
	}
	h.procs = map[int]string{}
	for _, pid := range harness.ProcessTree(workerPid) {
		if start, ok := startTime(pid); ok {
			h.procs[pid] = start
		}
	}
	return h
}

// childrenNamed counts pid's children whose command is name.
func childrenNamed(pid int, name string) int {
	n := 0
	for _, c := range harness.ProcessTree(pid)[1:] {
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", c)); strings.TrimSpace(string(comm)) == name && parentOf(c) == pid {
			n++
		}
	}
	return n
}

func parentOf(pid int) int {
	f := harness.ProcStat(pid)
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// startTime is the process's start time, and whether it runs: not gone, not a zombie.
func startTime(pid int) (string, bool) {
	f := harness.ProcStat(pid)
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return "", false
	}
	return f[19], true
}

// TestCrashedWorkersWarmSandboxesRemovedAtRestart: a worker SIGKILLed while its pool holds
// warm bubblewrap sandboxes, each with its spare bwrap started, and a job runs in another,
// leaves nothing once the next worker on the same Root has started: no lock file, workdir,
// scratch or egress folder, cgroup or process of the dead worker's sandboxes.
func TestCrashedWorkersWarmSandboxesRemovedAtRestart(t *testing.T) {
	t.Parallel()
	root := sandboxRoot(t)
	ns := startNATS(t)
	store := "file://" + t.TempDir()
	text := strings.Replace(string(examples.Config), "concurrency: 2\n", "concurrency: 3\n", 1)
	text = strings.Replace(text, "  csv-analyst:\n", "  csv-analyst:\n    warm: {min: 2, idle: 1h}\n", 1)
	text += fmt.Sprintf("sandbox:\n  bubblewrap:\n    root: %s\nnats:\n  url: %s\nstore:\n  url: %s\n", root, ns.ClientURL(), store)
	config := filepath.Join(t.TempDir(), "warm.yaml")
	if err := os.WriteFile(config, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	model := newHangingModel(t)
	env := map[string]string{"NATS_URL": ns.ClientURL(), "BOXCAR_STORE": store}

	w1, addrs := startWorkerProcess(t, "worker 1", config, model.url)
	url := "http://" + addrs.Metrics
	out, err := submitWith(t, env, "run", "--profile", "csv-analyst", "--task", "Summarise sales.csv",
		"--input", "../../examples/sales.csv", "--output", "json")
	if err != nil {
		t.Fatalf("submit: %v\n%s", err, out)
	}
	select {
	case <-model.hung:
	case <-time.After(harness.Timeout(harness.DefaultTimeout)):
		t.Fatal("the job never reached its second model request")
	}
	// The job holds a warm sandbox; the pool has refilled to its minimum, each with its spare
	// (the job's own may still wait for its first command).
	harness.Wait(t, "two warm sandboxes with their spares beside the job's", func() (bool, error) {
		size := metric(t, url, `boxcar_pool_size{profile="csv-analyst"}`)
		locks, _ := filepath.Glob(filepath.Join(root, "boxcar-*.lock"))
		spares := childrenNamed(w1.Pid(), "bwrap")
		return size == 2 && len(locks) == 3 && spares >= 2, errors.Join(fmt.Errorf("pool %v, lock files %d, bwrap children %d", size, len(locks), spares), w1.Exited())
	})
	left := snapshotSandboxes(t, root, w1.Pid())
	if len(left.paths) < 12 || len(left.procs) < 3 {
		t.Fatalf("the worker holds %d paths and %d processes; want 3 sandboxes' and the spares'", len(left.paths), len(left.procs))
	}
	w1.Kill()

	startWorkerProcess(t, "worker 2", config, model.url)
	for _, path := range left.paths {
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s of the dead worker's sandboxes is still there once the next worker started (%v)", path, err)
		}
	}
	for pid, start := range left.procs {
		if now, ok := startTime(pid); ok && now == start {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			t.Errorf("process %d (%s) of the dead worker still runs once the next worker started", pid, strings.ReplaceAll(string(comm), "\x00", " "))
		}
	}
}
