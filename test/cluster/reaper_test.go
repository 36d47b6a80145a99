package cluster_test

import (
	"context"
	"errors"
	"slices"
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

// TestReaper leaves a sandbox pod behind as a crashed worker would, and runs the reaper the
// worker runs: it must delete the orphan and spare the pod of a job still held.
func TestReaper(t *testing.T) {
	ns := sandboxNamespace(t)
	ctx := t.Context()
	p := newProvider(t, ns, "reaper-test")
	start := func(job string) sandbox.Sandbox {
		sb, err := p.Start(ctx, sandboxtest.Spec(job, config.SandboxSpec{}))
		if err != nil {
			t.Fatalf("Start %s: %v", job, err)
		}
		// The orphan is never closed by its "worker"; Close after the reaper is a no-op.
		t.Cleanup(func() { sb.Close(context.Background()) })
		return sb
	}
	orphan, held := start("orphan-job"), start("held-job")

	var mu sync.Mutex
	var asked []string
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- p.RunReaper(rctx, time.Second, func(j sandbox.PodJob) bool {
			mu.Lock()
			defer mu.Unlock()
			asked = append(asked, j.Worker+"/"+j.JobID)
			return j.JobID == "held-job"
		})
	}()
	harness.Wait(t, "the orphan pod to be deleted", func() (bool, error) {
		if !reaped(ctx, ns, orphan.Info().ID) {
			return false, errors.New("orphan pod still there")
		}
		return true, nil
	})
	// Pods younger than the interval are not yet asked about: wait for a round that weighed
	// the held pod, then stop the reaper.
	harness.Wait(t, "the reaper to ask about the held job", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		if !slices.Contains(asked, "reaper-test/held-job") {
			return false, errors.New("not asked yet")
		}
		return true, nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("RunReaper: %v", err)
	}
	if reaped(ctx, ns, held.Info().ID) {
		t.Fatal("the reaper deleted the pod of a held job")
	}
	if got := sandboxtest.Sh(t, held, "echo still here").Stdout; string(got) != "still here\n" {
		t.Errorf("held sandbox after the reaper: %q", got)
	}
	mu.Lock()
	if !slices.Contains(asked, "reaper-test/orphan-job") {
		t.Errorf("reaper asked about %v, want the orphan's job under worker reaper-test", asked)
	}
	mu.Unlock()
	// The held pod's containers run on the node (this also shows the check below can see them),
	// and the orphan's are gone from the node too, not only from the API.
	if ids, err := kube.RunningContainers(ctx, ns, held.Info().ID); err != nil || len(ids) != 2 {
		t.Errorf("held pod's running containers = %v, %v; want its sandbox and its container", ids, err)
	}
	harness.Wait(t, "the orphan's containers to be gone", func() (bool, error) {
		ids, err := kube.RunningContainers(ctx, ns, orphan.Info().ID)
		if err == nil && len(ids) > 0 {
			return false, errors.New("containers left")
		}
		return err == nil, err
	})
}

// reaped reports whether the pod is gone or going.
func reaped(ctx context.Context, ns, name string) bool {
	pod, err := kube.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true
	}
	return err == nil && pod.DeletionTimestamp != nil
}
