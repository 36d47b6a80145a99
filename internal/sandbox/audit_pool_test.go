package sandbox_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// failDeletes makes the next n pod deletes fail, as an API server that did not answer.
func failDeletes(client *fake.Clientset, n int32) {
	var left atomic.Int32
	left.Store(n)
	client.PrependReactor("delete", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if left.Add(-1) >= 0 {
			return true, nil, errors.New("the API server did not answer")
		}
		return false, nil, nil
	})
}

// TestAuditPoolReaperRemovesOrphanedPoolPodOfOwnRun: a warm pod of this worker run that no
// sandbox holds any more (its start failed and the delete on that path failed; or the pool
// closed it and the delete failed) is an orphan: nothing in the worker will delete it again.
// The reaper must remove it as it removes a cold job pod whose job is no longer held; it keeps
// it instead, for the rest of the worker run's life, because it keeps every unclaimed pool pod
// of its own run.
func TestAuditPoolReaperRemovesOrphanedPoolPodOfOwnRun(t *testing.T) {
	poolSpec := func() sandbox.Spec {
		spec := sandboxtest.Spec("", config.SandboxSpec{})
		spec.Pool, spec.Ahead = "p", time.Minute
		return spec
	}
	nobodyHolds := func(string, string) bool { return false }

	t.Run("start failed, delete failed", func(t *testing.T) {
		client := fake.NewClientset()
		st := waiting("ErrImagePull")
		fakeKubelet(t, client, func(*corev1.Pod) *corev1.PodStatus { return &st })
		p := newKubernetes(t, client)
		failDeletes(client, 1)
		if _, err := p.Start(t.Context(), poolSpec()); err == nil {
			t.Fatal("Start succeeded; the pod was to fail its image pull")
		}
		if _, err := p.Reap(t.Context(), nobodyHolds, 0); err != nil {
			t.Fatal(err)
		}
		expectNoPods(t, client)
	})

	t.Run("pool closed it, delete failed", func(t *testing.T) {
		client := fake.NewClientset()
		fakeKubelet(t, client, nil)
		p := newKubernetes(t, client)
		sb, err := p.Start(t.Context(), poolSpec())
		if err != nil {
			t.Fatal(err)
		}
		failDeletes(client, 1)
		if err := sb.Close(t.Context()); err == nil {
			t.Fatal("Close succeeded; the delete was to fail")
		}
		if _, err := p.Reap(t.Context(), nobodyHolds, 0); err != nil {
			t.Fatal(err)
		}
		expectNoPods(t, client)
	})

	// The cold pod in the same situation is reaped: the difference is the pool label.
	t.Run("cold pod, for comparison", func(t *testing.T) {
		client := fake.NewClientset()
		st := waiting("ErrImagePull")
		fakeKubelet(t, client, func(*corev1.Pod) *corev1.PodStatus { return &st })
		p := newKubernetes(t, client)
		failDeletes(client, 1)
		if _, err := p.Start(t.Context(), sandboxtest.Spec("job-1", config.SandboxSpec{})); err == nil {
			t.Fatal("Start succeeded; the pod was to fail its image pull")
		}
		if _, err := p.Reap(t.Context(), nobodyHolds, 0); err != nil {
			t.Fatal(err)
		}
		expectNoPods(t, client)
	})
}
