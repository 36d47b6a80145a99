package sandbox_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// TestKubernetesPoolPodClaim: a warm pod names its pool and no job until its claim, which
// labels and annotates it with the job and shortens its deadline to the lifetime from now.
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
	if pod.Labels[sandbox.LabelPool] != "csv-analyst" || pod.Labels[sandbox.LabelJobID] != "" || pod.Annotations["boxcar.run/job-id"] != "" {
		t.Errorf("warm pod labels %v annotations %v; want the pool named and no job", pod.Labels, pod.Annotations)
	}
	if d := *pod.Spec.ActiveDeadlineSeconds; d != int64((50 * time.Minute).Seconds()) {
		t.Errorf("warm pod deadline %ds, want ahead + lifetime (3000s)", d)
	}
	if err := sb.(sandbox.Claimer).Claim(t.Context(), "job-42"); err != nil {
		t.Fatal(err)
	}
	pod = getPod(t, client, sb.Info().ID)
	if pod.Labels[sandbox.LabelJobID] != "job-42" || pod.Annotations["boxcar.run/job-id"] != "job-42" || pod.Labels[sandbox.LabelPool] != "csv-analyst" {
		t.Errorf("claimed pod labels %v annotations %v; want job-42 named", pod.Labels, pod.Annotations)
	}
	if d := *pod.Spec.ActiveDeadlineSeconds; d < 1200 || d > 1230 {
		t.Errorf("claimed pod deadline %ds, want the 1200s lifetime from the claim", d)
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
	held := func(job, worker string) bool { return job == "" && worker == "w2" }
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

func getPod(t *testing.T, client *fake.Clientset, name string) *corev1.Pod {
	t.Helper()
	pod, err := client.CoreV1().Pods(testNamespace).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}
