package sandbox_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// sandboxNamespace is the sandbox namespace as it is while it takes pods: an owner missing from
// one being deleted or gone is the namespace's answer (TestKubernetesNamespaceBeingDeleted).
func sandboxNamespace() *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceActive}}
}

// TestKubernetesPodsOwned: with an Owner, every pod the provider starts, warm or a job's, is
// owned by that ConfigMap, so that deleting it (helm uninstall) has the garbage collector
// delete them whatever became of the worker. A missing owner starts no pod and fails Check.
func TestKubernetesPodsOwned(t *testing.T) {
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "boxcar-sandboxes", Namespace: testNamespace, UID: "uid-1"}}
	client := fake.NewClientset(owner, sandboxNamespace())
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

	orphan := fake.NewClientset(sandboxNamespace())
	p = newKubernetes(t, orphan, func(c *sandbox.KubernetesConfig) { c.Owner = "gone" })
	if _, err := p.Start(t.Context(), sandboxtest.Spec("job-2", config.SandboxSpec{})); !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), `configmaps "gone" not found`) {
		t.Errorf("Start without its owner: %v, want ErrUnavailable naming the owner", err)
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

// allowEverything has the fake API server allow every access review, as a worker's Role does.
func allowEverything(client *fake.Clientset) {
	client.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview).DeepCopy()
		r.Status.Allowed = true
		return true, r, nil
	})
}

// makeOwnerAgain deletes the owner ConfigMap and makes it again under uid, as kubectl delete
// and apply, a reinstall or a rollback do.
func makeOwnerAgain(t *testing.T, client *fake.Clientset, owner *corev1.ConfigMap, uid k8stypes.UID) {
	t.Helper()
	if err := client.CoreV1().ConfigMaps(testNamespace).Delete(t.Context(), owner.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	again := owner.DeepCopy()
	again.UID = uid
	if _, err := client.CoreV1().ConfigMaps(testNamespace).Create(t.Context(), again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestKubernetesCheckLooksUpTheOwnerAgain: Check, which /readyz calls and which promises the
// pods' owner exists, reads the owner ConfigMap each time: deleted, the worker is not ready;
// made again under a new UID, the pods started after it name that UID. A pod naming a UID that
// no longer exists is deleted by the garbage collector at once, so a UID kept for the
// process's life would have every later start fail.
func TestKubernetesCheckLooksUpTheOwnerAgain(t *testing.T) {
	t.Parallel()
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "boxcar-sandboxes", Namespace: testNamespace, UID: "uid-1"}}
	client := fake.NewClientset(owner, sandboxNamespace())
	allowEverything(client)
	fakeKubelet(t, client, nil)
	p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.Owner = owner.Name })
	startOwned := func(job string, uid k8stypes.UID) {
		t.Helper()
		sb, err := p.Start(t.Context(), sandboxtest.Spec(job, config.SandboxSpec{}))
		if err != nil {
			t.Fatal(err)
		}
		if refs := getPod(t, client, sb.Info().ID).OwnerReferences; len(refs) != 1 || refs[0].UID != uid {
			t.Errorf("pod of %s has owners %+v, want the live owner's UID %s", job, refs, uid)
		}
	}
	startOwned("job-1", "uid-1")
	if err := p.Check(t.Context()); err != nil {
		t.Fatalf("Check with the owner in place: %v", err)
	}
	if err := client.CoreV1().ConfigMaps(testNamespace).Delete(t.Context(), owner.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := p.Check(t.Context()); !errors.Is(err, sandbox.ErrUnavailable) || !apierrors.IsNotFound(err) {
		t.Errorf("Check with the owner ConfigMap deleted: %v, want ErrUnavailable and its NotFound", err)
	}
	again := owner.DeepCopy()
	again.UID = "uid-2"
	if _, err := client.CoreV1().ConfigMaps(testNamespace).Create(t.Context(), again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	startOwned("job-2", "uid-2")

	// Made again between two Checks: the second finds the new UID.
	makeOwnerAgain(t, client, owner, "uid-3")
	if err := p.Check(t.Context()); err != nil {
		t.Fatalf("Check with the owner made again: %v", err)
	}
	startOwned("job-3", "uid-3")
}

// TestKubernetesStartAfterOwnerMadeAgain: with no Check between, a start whose pod names the
// owner's old UID sees the garbage collector delete it, looks the owner up again, and starts
// once more under the new UID. An owner that is gone (deleted with its namespace or the
// release) makes the start ErrUnavailable, naming the owner, so the job waits with its delivery
// kept (TestKubernetesNamespaceBeingDeleted), and the next start creates no pod.
func TestKubernetesStartAfterOwnerMadeAgain(t *testing.T) {
	t.Parallel()
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "boxcar-sandboxes", Namespace: testNamespace, UID: "uid-1"}}
	client := fake.NewClientset(owner, sandboxNamespace())
	creates := garbageCollector(t, client)
	p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.Owner = owner.Name })
	if _, err := p.Start(t.Context(), sandboxtest.Spec("job-1", config.SandboxSpec{})); err != nil {
		t.Fatal(err)
	}
	makeOwnerAgain(t, client, owner, "uid-2")
	sb, err := p.Start(t.Context(), sandboxtest.Spec("job-2", config.SandboxSpec{}))
	if err != nil {
		t.Fatalf("Start after the owner was made again: %v", err)
	}
	if refs := getPod(t, client, sb.Info().ID).OwnerReferences; len(refs) != 1 || refs[0].UID != "uid-2" {
		t.Errorf("pod owners %+v, want the new owner's UID uid-2", refs)
	}
	if n := creates.Load(); n != 3 {
		t.Errorf("%d pods created, want 3: job-1's, job-2's the collector deleted, and job-2's again", n)
	}

	if err := client.CoreV1().ConfigMaps(testNamespace).Delete(t.Context(), owner.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, job := range []string{"job-3", "job-4"} {
		if _, err := p.Start(t.Context(), sandboxtest.Spec(job, config.SandboxSpec{})); !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), `configmaps "boxcar-sandboxes" not found`) {
			t.Errorf("Start of %s with the owner gone: %v, want ErrUnavailable naming the owner", job, err)
		}
	}
	if n := creates.Load(); n != 4 {
		t.Errorf("%d pods created, want 4: none once the owner is known to be gone", n)
	}
}

// garbageCollector plays the API server, the kubelet and the garbage collector for pods with
// an owner: a pod whose owner's UID is the live ConfigMap's runs at once, any other is made
// and deleted, as the collector deletes a pod whose owner does not exist. It counts creates.
func garbageCollector(t *testing.T, client *fake.Clientset) *atomic.Int32 {
	t.Helper()
	var creates atomic.Int32
	pods, configMaps := corev1.SchemeGroupVersion.WithResource("pods"), corev1.SchemeGroupVersion.WithResource("configmaps")
	// The fake clientset holds its lock while a reactor runs: the reactor uses the tracker.
	client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		creates.Add(1)
		pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod).DeepCopy()
		ref := pod.OwnerReferences[0]
		live, err := client.Tracker().Get(configMaps, a.GetNamespace(), ref.Name)
		owned := err == nil && live.(*corev1.ConfigMap).UID == ref.UID
		if owned {
			pod.Status = running()
		}
		if err := client.Tracker().Create(pods, pod, a.GetNamespace()); err != nil {
			return true, nil, err
		}
		if !owned {
			if err := client.Tracker().Delete(pods, a.GetNamespace(), pod.Name); err != nil {
				t.Error(err)
			}
		}
		return true, pod, nil
	})
	// Start's wait lists its pod by name, which the fake clientset ignores (it would find
	// another pod for one the collector deleted): this list does as the API server does.
	client.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj, err := client.Tracker().List(pods, corev1.SchemeGroupVersion.WithKind("Pod"), a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		list := obj.(*corev1.PodList)
		match := a.(k8stesting.ListAction).GetListRestrictions().Fields
		list.Items = slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return !match.Matches(fields.Set{"metadata.name": p.Name}) })
		return true, list, nil
	})
	return &creates
}
