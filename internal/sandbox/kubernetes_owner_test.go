package sandbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// TestKubernetesPodsOwned: with an Owner, every pod the provider starts, warm or a job's, is
// owned by that ConfigMap, so that deleting it (helm uninstall) has the garbage collector
// delete them whatever became of the worker. A missing owner starts no pod and fails Check.
func TestKubernetesPodsOwned(t *testing.T) {
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "boxcar-sandboxes", Namespace: testNamespace, UID: "uid-1"}}
	client := fake.NewClientset(owner)
	fakeKubelet(t, client, nil)
	p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.Owner = owner.Name })
	warm := sandboxtest.Spec("", config.SandboxSpec{})
	warm.Pool, warm.Ahead = "csv-analyst", time.Minute
	for _, spec := range []sandbox.Spec{sandboxtest.Spec("job-1", config.SandboxSpec{}), warm} {
		sb, err := p.Start(t.Context(), spec)
		if err != nil {
			t.Fatal(err)
		}
		want := metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID}
		if got := getPod(t, client, sb.Info().ID).OwnerReferences; len(got) != 1 || got[0] != want {
			t.Errorf("pod %s owners %+v, want only %+v", sb.Info().ID, got, want)
		}
	}

	orphan := fake.NewClientset()
	p = newKubernetes(t, orphan, func(c *sandbox.KubernetesConfig) { c.Owner = "gone" })
	if _, err := p.Start(t.Context(), sandboxtest.Spec("job-2", config.SandboxSpec{})); !apierrors.IsNotFound(err) {
		t.Errorf("Start without its owner: %v, want the owner's NotFound", err)
	}
	if pods, _ := orphan.CoreV1().Pods(testNamespace).List(t.Context(), metav1.ListOptions{}); len(pods.Items) != 0 {
		t.Errorf("Start without its owner left %d pods", len(pods.Items))
	}
	if err := p.Check(t.Context()); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Errorf("Check without the owner: %v, want ErrUnavailable", err)
	}
}

// TestKubernetesStartLostCreate: a create the API server carried out but whose answer the
// worker never got (its ctx ended, as when it stops; the connection broke) leaves no pod
// behind; a create the API server refused deletes nothing.
func TestKubernetesStartLostCreate(t *testing.T) {
	for _, tt := range []struct {
		name    string
		made    bool // the API server made the pod
		answer  func(cancel context.CancelFunc) error
		deletes bool
	}{
		{name: "worker stopping", made: true, deletes: true, answer: func(cancel context.CancelFunc) error {
			cancel()
			return context.Canceled
		}},
		{name: "connection broke", made: true, deletes: true, answer: func(context.CancelFunc) error {
			return errors.New("http2: client connection lost")
		}},
		{name: "server timeout", made: true, deletes: true, answer: func(context.CancelFunc) error {
			return apierrors.NewTimeoutError("request did not complete within 60s", 0)
		}},
		{name: "refused", answer: func(context.CancelFunc) error {
			return apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("quota exceeded"))
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if tt.made {
					pod := a.(k8stesting.CreateAction).GetObject()
					if err := client.Tracker().Create(a.GetResource(), pod, a.GetNamespace()); err != nil {
						t.Fatal(err)
					}
				}
				return true, nil, tt.answer(cancel)
			})
			p := newKubernetes(t, client)
			spec := sandboxtest.Spec("", config.SandboxSpec{})
			spec.Pool, spec.Ahead = "p", time.Minute
			if _, err := p.Start(ctx, spec); err == nil {
				t.Fatal("Start succeeded; want the create's error")
			}
			pods, err := client.CoreV1().Pods(testNamespace).List(t.Context(), metav1.ListOptions{})
			if err != nil || len(pods.Items) != 0 {
				t.Errorf("%d pods left (%v), want none", len(pods.Items), err)
			}
			var deletes int
			for _, a := range client.Actions() {
				if a.GetVerb() == "delete" {
					deletes++
				}
			}
			if deleted := deletes > 0; deleted != tt.deletes {
				t.Errorf("Start deleted %d pods; want a delete: %v", deletes, tt.deletes)
			}
		})
	}
}
