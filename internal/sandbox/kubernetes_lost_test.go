package sandbox_test

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// TestKubernetesPodLostMidJob: a sandbox pod that goes away under its job (deleted, evicted,
// ended by its deadline) makes every later call fail with ErrSandboxLost, and with
// ErrDiskFull too when the kubelet evicted it for its own disk use, which the job caused.
func TestKubernetesPodLostMidJob(t *testing.T) {
	t.Parallel()
	notFound := func(pod string) error { return apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, pod) }
	stopped := func(string) error { return errors.New(`container not found ("sandbox")`) }
	evicted := func(message string) func(*corev1.Pod) {
		return func(pod *corev1.Pod) {
			pod.Status = corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: message}
		}
	}
	for _, tt := range []struct {
		name     string
		answer   func(pod string) error
		update   func(*corev1.Pod) // the pod's status after the loss; nil: the pod is deleted
		diskFull bool
	}{
		{name: "deleted", answer: notFound},
		{name: "evicted for its workdir", answer: stopped, diskFull: true,
			update: evicted(`Usage of EmptyDir volume "workdir" exceeds the limit "1Gi". `)},
		{name: "evicted for its ephemeral storage", answer: stopped, diskFull: true,
			update: evicted(`Pod ephemeral local storage usage exceeds the total limit of containers 1088Mi. `)},
		{name: "evicted for the node's disk", answer: stopped,
			update: evicted("The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 9Gi. ")},
		{name: "past its deadline", answer: stopped, update: func(pod *corev1.Pod) {
			pod.Status = corev1.PodStatus{Phase: corev1.PodFailed, Reason: "DeadlineExceeded", Message: "Pod was active on the node longer than the specified deadline"}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			client := fake.NewClientset()
			fakeKubelet(t, client, nil)
			ex := &sandboxtest.LostExec{}
			p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.Executor = ex })
			sb := sandboxtest.Start(t, p)
			name := sb.Info().ID
			sandboxtest.RunLost(t, sb, func(t *testing.T) {
				pods := client.CoreV1().Pods(testNamespace)
				if tt.update == nil {
					if err := pods.Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
						t.Fatal(err)
					}
				} else {
					pod, err := pods.Get(t.Context(), name, metav1.GetOptions{})
					if err != nil {
						t.Fatal(err)
					}
					tt.update(pod)
					if _, err := pods.UpdateStatus(t.Context(), pod, metav1.UpdateOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				answer := tt.answer(name)
				ex.Answer.Store(&answer)
			}, tt.diskFull)
		})
	}
}
