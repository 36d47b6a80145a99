package sandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// TestKubernetesPoolPodClaim: a warm pod names its pool and no job nor tenant until its claim,
// which labels and annotates it with the job and its tenant, as a cold pod is, and shortens its
// deadline to the lifetime from now.
func TestKubernetesPoolPodClaim(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, nil)
	p := newKubernetes(t, client)
	spec := sandboxtest.Spec("", config.SandboxSpec{Lifetime: config.Duration(20 * time.Minute)})
	spec.Pool, spec.Ahead = "csv-analyst", 30*time.Minute
	sb, err := p.Start(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close(t.Context()) })
	pod := getPod(t, client, sb.Info().ID)
	if pod.Labels[sandbox.LabelPool] != "csv-analyst" || pod.Labels[sandbox.LabelJobID] != "" || pod.Annotations["boxcar.run/job-id"] != "" ||
		pod.Labels[sandbox.LabelTenant] != "" || pod.Annotations["boxcar.run/tenant"] != "" {
		t.Errorf("warm pod labels %v annotations %v; want the pool named and no job nor tenant", pod.Labels, pod.Annotations)
	}
	if d := *pod.Spec.ActiveDeadlineSeconds; d != int64((50 * time.Minute).Seconds()) {
		t.Errorf("warm pod deadline %ds, want ahead + lifetime (3000s)", d)
	}
	if err := sb.(sandbox.Claimer).Claim(t.Context(), "team-a", "job-42"); err != nil {
		t.Fatal(err)
	}
	pod = getPod(t, client, sb.Info().ID)
	if pod.Labels[sandbox.LabelJobID] != "job-42" || pod.Annotations["boxcar.run/job-id"] != "job-42" || pod.Labels[sandbox.LabelPool] != "csv-analyst" {
		t.Errorf("claimed pod labels %v annotations %v; want job-42 named", pod.Labels, pod.Annotations)
	}
	if pod.Labels[sandbox.LabelTenant] != "team-a" || pod.Annotations["boxcar.run/tenant"] != "team-a" {
		t.Errorf("claimed pod labels %v annotations %v; want tenant team-a named, as on a cold pod", pod.Labels, pod.Annotations)
	}
	if d := *pod.Spec.ActiveDeadlineSeconds; d < 1200 || d > 1230 {
		t.Errorf("claimed pod deadline %ds, want the 1200s lifetime from the claim", d)
	}
}

// refuseDeadlineIncrease has the fake API server refuse a pod patch that raises the pod's
// activeDeadlineSeconds, as the real one does (ValidatePodUpdate: "must be less than or equal
// to previous value").
func refuseDeadlineIncrease(client *fake.Clientset) {
	client.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pa := a.(k8stesting.PatchAction)
		var patch struct {
			Spec struct {
				ActiveDeadlineSeconds *int64 `json:"activeDeadlineSeconds"`
			} `json:"spec"`
		}
		if err := json.Unmarshal(pa.GetPatch(), &patch); err != nil || patch.Spec.ActiveDeadlineSeconds == nil {
			return false, nil, nil
		}
		obj, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), pa.GetNamespace(), pa.GetName())
		if err != nil {
			return false, nil, nil
		}
		if old := obj.(*corev1.Pod).Spec.ActiveDeadlineSeconds; old != nil && *patch.Spec.ActiveDeadlineSeconds > *old {
			return true, nil, apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Pod").GroupKind(), pa.GetName(), field.ErrorList{
				field.Invalid(field.NewPath("spec", "activeDeadlineSeconds"), *patch.Spec.ActiveDeadlineSeconds, "must be less than or equal to previous value"),
			})
		}
		return false, nil, nil
	})
}

// TestKubernetesClaimNearMaxAge: a warm pod claimed later than Ahead after its start (the pool
// holds it up to max_age from its start's beginning, and the claim comes a moment after the
// take) asks for no longer deadline than it has: the API server refuses any increase of
// activeDeadlineSeconds, and the claim failed. The job gets what is left of the pod's deadline.
func TestKubernetesClaimNearMaxAge(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, nil)
	refuseDeadlineIncrease(client)
	p := newKubernetes(t, client)
	spec := sandboxtest.Spec("", config.SandboxSpec{Lifetime: config.Duration(20 * time.Minute)})
	spec.Pool, spec.Ahead = "p", 30*time.Minute
	sb, err := p.Start(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close(t.Context()) })
	sandbox.AgeKubernetesSandbox(sb, 30*time.Minute+2*time.Second)
	if err := sb.(sandbox.Claimer).Claim(t.Context(), "default", "job-1"); err != nil {
		t.Fatalf("claim of a pod just past Ahead: %v", err)
	}
	if d := *getPod(t, client, sb.Info().ID).Spec.ActiveDeadlineSeconds; d != int64((50 * time.Minute).Seconds()) {
		t.Errorf("claimed pod deadline %ds, want the pod's own 3000s kept", d)
	}
}

// TestKubernetesReapPoolPods: an unclaimed warm pod is kept by the worker run that started it
// and while its worker lives; an earlier run's, or a dead worker's, is reaped.
func TestKubernetesReapPoolPods(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, nil)
	start := func(p *sandbox.KubernetesProvider) string {
		spec := sandboxtest.Spec("", config.SandboxSpec{})
		spec.Pool, spec.Ahead = "p", time.Minute
		sb, err := p.Start(t.Context(), spec)
		if err != nil {
			t.Fatal(err)
		}
		return sb.Info().ID
	}
	earlier := start(newKubernetes(t, client))                                                       // w1, a run that stopped
	mine := start(newKubernetes(t, client))                                                          // replaced below by the reaping one
	live := start(newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.WorkerID = "w2" })) // a live worker's
	dead := start(newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.WorkerID = "w3" })) // a dead worker's
	reaper := newKubernetes(t, client)
	own := start(reaper)
	held := func(j sandbox.PodJob) bool { return j.JobID == "" && j.Worker == "w2" }
	if _, err := reaper.Reap(t.Context(), held, 0); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		kept bool
	}{{earlier, false}, {mine, false}, {live, true}, {dead, false}, {own, true}} {
		_, err := client.CoreV1().Pods(testNamespace).Get(t.Context(), tt.name, metav1.GetOptions{})
		if kept := err == nil; kept != tt.kept || (err != nil && !apierrors.IsNotFound(err)) {
			t.Errorf("pod %s kept = %v, want %v (%v)", tt.name, kept, tt.kept, err)
		}
	}
}

// TestKubernetesReapClaimedPoolPodByTenant: the reaper asks about a claimed warm pod with its
// job's tenant, as about a cold pod, so that a worker that does not serve the tenant spares
// it and one that serves it judges it by that tenant's status, rather than looking the job up
// in every tenant it serves.
func TestKubernetesReapClaimedPoolPodByTenant(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, nil)
	other := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.WorkerID = "w2" })
	spec := sandboxtest.Spec("", config.SandboxSpec{})
	spec.Pool, spec.Ahead = "p", time.Minute
	warm, err := other.Start(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.(sandbox.Claimer).Claim(t.Context(), "team-b", "job-warm"); err != nil {
		t.Fatal(err)
	}
	coldSpec := sandboxtest.Spec("job-cold", config.SandboxSpec{})
	coldSpec.Tenant = "team-b"
	cold, err := other.Start(t.Context(), coldSpec)
	if err != nil {
		t.Fatal(err)
	}
	asked := map[string]sandbox.PodJob{}
	held := func(j sandbox.PodJob) bool { asked[j.JobID] = j; return true }
	if _, err := newKubernetes(t, client).Reap(t.Context(), held, 0); err != nil {
		t.Fatal(err)
	}
	if got, want := asked["job-warm"], (sandbox.PodJob{JobID: "job-warm", Tenant: "team-b", Worker: "w2"}); got != want {
		t.Errorf("the reaper asked about the claimed warm pod %s as %+v, want %+v", warm.Info().ID, got, want)
	}
	if got, want := asked["job-cold"], (sandbox.PodJob{JobID: "job-cold", Tenant: "team-b", Worker: "w2"}); got != want {
		t.Errorf("the reaper asked about the cold pod %s as %+v, want %+v", cold.Info().ID, got, want)
	}
}

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

// TestKubernetesReapOrphanedPoolPods: a warm pod of this worker run that no sandbox holds any
// more (its start failed and the delete on that path failed; or its sandbox was closed and the
// delete failed) is an orphan, and the reaper removes it as it removes a cold job pod whose job
// is no longer held. It kept every unclaimed pool pod of its own run, for the rest of the run.
func TestKubernetesReapOrphanedPoolPods(t *testing.T) {
	poolSpec := func() sandbox.Spec {
		spec := sandboxtest.Spec("", config.SandboxSpec{})
		spec.Pool, spec.Ahead = "p", time.Minute
		return spec
	}
	nobodyHolds := func(sandbox.PodJob) bool { return false }

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

func getPod(t *testing.T, client *fake.Clientset, name string) *corev1.Pod {
	t.Helper()
	pod, err := client.CoreV1().Pods(testNamespace).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// TestKubernetesWarmInfoAsCold: what a pod claimed after 10 minutes in its pool says of
// itself, which the manifest records, is what a cold pod of the same spec says, but for its
// name: its isolation said active_deadline=1800s, the pod's deadline from its creation.
func TestKubernetesWarmInfoAsCold(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, nil)
	p := newKubernetes(t, client)
	spec := sandboxtest.Spec("job-1", config.SandboxSpec{Lifetime: config.Duration(20 * time.Minute)})
	cold, err := p.Start(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cold.Close(context.Background()) })
	spec.JobID, spec.Pool, spec.Ahead = "", "p", 30*time.Minute
	warm, err := p.Start(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = warm.Close(context.Background()) })
	sandbox.AgeKubernetesSandbox(warm, 10*time.Minute) // it waited in its pool
	if err := warm.(sandbox.Claimer).Claim(t.Context(), "default", "job-2"); err != nil {
		t.Fatal(err)
	}
	w, c := warm.Info(), cold.Info()
	w.ID = c.ID
	if w != c {
		t.Errorf("a claimed warm pod says %+v; a cold one %+v", w, c)
	}
}
