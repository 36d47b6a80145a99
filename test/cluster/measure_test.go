package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
	"github.com/boxcar-run/boxcar/test/harness"
)

// figures are the timings TestMain prints after the run.
var figures struct {
	sync.Mutex
	lines []string
}

func record(format string, args ...any) {
	figures.Lock()
	defer figures.Unlock()
	figures.lines = append(figures.lines, fmt.Sprintf(format, args...))
}

// TestFigures measures what a sandbox costs on this cluster: pod start (create to Running,
// through the backend's watch), the round trip of a short exec, and delete to gone.
func TestFigures(t *testing.T) {
	ns := sandboxNamespace(t)
	p := newProvider(t, ns, "figures")
	ctx := t.Context()
	var starts, deletes []time.Duration
	var execs []time.Duration
	for i := range 3 {
		begin := time.Now()
		sb, err := p.Start(ctx, sandboxtest.Spec(fmt.Sprintf("figures-%d", i), config.SandboxSpec{}))
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		starts = append(starts, time.Since(begin))
		for range 10 {
			begin := time.Now()
			res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: 10 * time.Second})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("exec true: %v, exit %d", err, res.ExitCode)
			}
			execs = append(execs, time.Since(begin))
		}
		name := sb.Info().ID
		begin = time.Now()
		if err := sb.Close(context.WithoutCancel(ctx)); err != nil {
			t.Fatalf("Close: %v", err)
		}
		harness.Wait(t, "pod "+name+" gone", func() (bool, error) {
			_, err := kube.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return false, fmt.Errorf("still there (%v)", err)
		})
		deletes = append(deletes, time.Since(begin))
	}
	record("pod start (create to Running): %s", spread(starts))
	record("exec round trip (true):        %s", spread(execs))
	record("pod delete (Close to gone):    %s", spread(deletes))
}

// spread is "median (min–max)" of ds.
func spread(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	r := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	return strings.Join([]string{r(s[len(s)/2]), " (", r(s[0]), "–", r(s[len(s)-1]), ", n=", fmt.Sprint(len(s)), ")"}, "")
}
