package cluster_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/test/cluster"
)

// kube is the cluster every test in this package uses; TestMain starts it once.
var kube *cluster.Handle

// TestMain brings the cluster up once, runs the tests and tears it down. The teardown is
// clusterd's: it also happens when a test panics or the test timeout kills this binary,
// because clusterd tears down when this process's end closes its stdin.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	var err error
	kube, err = cluster.Launch(ctx, log)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: test cluster: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "test cluster up in %s (in clusterd: %s; kubeconfig %s)\n",
		time.Since(start).Round(time.Millisecond), kube.Timings["total"].Round(time.Millisecond), kube.Kubeconfig)
	record("cluster up (clusterd, from built binaries): %s", kube.Timings["total"].Round(time.Millisecond))
	record("cluster up (TestMain): %s", time.Since(start).Round(time.Millisecond))
	code := m.Run()
	record("tests: %s", time.Since(start).Round(time.Millisecond))
	stop := time.Now()
	if err := kube.Close(context.Background(), code != 0); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		code = 1
	}
	record("teardown: %s", time.Since(stop).Round(time.Millisecond))
	// go test shows this output only with -v or on failure; the file keeps it in any case.
	var all strings.Builder
	for _, l := range figures.lines {
		fmt.Fprintln(&all, "figure:", l)
	}
	fmt.Fprint(os.Stderr, all.String())
	_ = os.WriteFile(filepath.Join(os.TempDir(), "boxcar-cluster", "figures.txt"), []byte(all.String()), 0o644)
	if code != 0 {
		fmt.Fprintf(os.Stderr, "component logs kept in %s\n", kube.LogDir)
	}
	return code
}
