package sandbox_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// namespaceTerminating is the API server's answer to a create in a namespace being deleted,
// as its NamespaceLifecycle admission builds it: a 403 with the NamespaceTerminating cause.
func namespaceTerminating(ns string) error {
	err := apierrors.NewForbidden(corev1.Resource("pods"), "boxcar-job-1-x",
		fmt.Errorf("unable to create new content in namespace %s because it is being terminated", ns))
	err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{
		Type: corev1.NamespaceTerminatingCause, Message: "namespace " + ns + " is being terminated", Field: "metadata.namespace",
	})
	return err
}

// lockedBuffer is a log sink the provider's goroutines may write while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestKubernetesNamespaceBeingDeleted: a sandbox namespace being deleted (its pod creates
// answered 403 "... because it is being terminated"), gone, or without the pods' owner
// ConfigMap (which a namespace's deletion removes first) takes no sandbox until someone makes
// it again, and no job can change that: Start is ErrUnavailable, so the job waits with its
// delivery kept and the worker fetches no more, the worker logs what happened and what to do,
// and Check (/readyz) says the worker is not ready, until a start succeeds again. Each start
// failed its job and spent a delivery, and /readyz said ready through the deletion. An owner
// gone with its namespace, being deleted or gone, is the namespace's answer, which says to
// wait for the deletion's end: Start and Check said owner_missing, "run helm upgrade", which
// the API server refuses in a namespace being deleted.
func TestKubernetesNamespaceBeingDeleted(t *testing.T) {
	t.Parallel()
	const owner = "boxcar.boxcar-sandboxes"
	deleted := metav1.Now()
	active := sandboxNamespace()
	terminating := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace, DeletionTimestamp: &deleted, Finalizers: []string{"kubernetes"}}, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceTerminating}}
	for _, tt := range []struct {
		name  string
		err   error // the pods' create answer while broken; nil: the owner ConfigMap is gone
		kind  string
		says  string // in Start's error, Check's and the log line
		hint  string // what to do, in the same three
		owned bool
		// namespace is the sandbox namespace while the owner is gone; nil: gone too.
		namespace *corev1.Namespace
	}{
		{name: "namespace being deleted", err: namespaceTerminating(testNamespace), kind: "namespace_terminating",
			says: "is being deleted", hint: "helm upgrade"},
		{name: "namespace gone", err: apierrors.NewNotFound(corev1.Resource("namespaces"), testNamespace), kind: "namespace_missing",
			says: "does not exist", hint: "helm upgrade"},
		{name: "the pods' owner gone", owned: true, namespace: active, kind: "owner_missing", says: owner, hint: "helm upgrade"},
		{name: "the pods' owner gone, its namespace being deleted", owned: true, namespace: terminating, kind: "namespace_terminating",
			says: "is being deleted", hint: "no longer lists it"},
		{name: "the pods' owner gone with its namespace", owned: true, kind: "namespace_missing", says: "sandbox namespace does not exist", hint: "helm upgrade"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			client := fake.NewClientset()
			if tt.namespace != nil {
				if _, err := client.CoreV1().Namespaces().Create(t.Context(), tt.namespace, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			fakeKubelet(t, client, nil)
			var broken atomic.Bool
			broken.Store(true)
			var dryRuns atomic.Int32
			client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				create := a.(k8stesting.CreateActionImpl)
				dryRun := slices.Contains(create.CreateOptions.DryRun, metav1.DryRunAll)
				if dryRun {
					dryRuns.Add(1)
					// Admission is asked only of a pod that passes validation, a sandbox pod's.
					pod := create.GetObject().(*corev1.Pod)
					if len(pod.Spec.Containers) == 0 || pod.Spec.Containers[0].Image == "" || len(restrictedRefusals(t, pod)) > 0 {
						t.Errorf("the dry run asks about pod %+v, which is not a sandbox pod", pod.Spec)
					}
				}
				switch {
				case broken.Load() && tt.err != nil:
					return true, nil, tt.err
				case dryRun: // admitted, and made nothing
					return true, create.GetObject(), nil
				}
				return false, nil, nil
			})
			client.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
				r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview).DeepCopy()
				r.Status.Allowed = true
				return true, r, nil
			})
			logs := &lockedBuffer{}
			p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) {
				c.Namespace = testNamespace
				c.Logger = slog.New(slog.NewTextHandler(logs, nil))
				if tt.owned {
					c.Owner = owner
				}
			})
			_, err := p.Start(t.Context(), sandboxtest.Spec("job-1", config.SandboxSpec{}))
			if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), tt.says) || !strings.Contains(err.Error(), tt.hint) {
				t.Fatalf("Start: %v; want ErrUnavailable saying %q and %q", err, tt.says, tt.hint)
			}
			if line := logs.String(); !strings.Contains(line, "kind="+tt.kind) || !strings.Contains(line, tt.says) || !strings.Contains(line, tt.hint) {
				t.Errorf("log:\n%s\nwant kind=%s saying %q and %q", line, tt.kind, tt.says, tt.hint)
			}
			err = p.Check(t.Context())
			if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), tt.says) || !strings.Contains(err.Error(), tt.hint) {
				t.Errorf("Check: %v; want the worker not ready, saying %q and %q", err, tt.says, tt.hint)
			}

			// Made again: the worker is ready before any job starts, and the next start takes a pod.
			broken.Store(false)
			if tt.owned {
				_ = client.CoreV1().Namespaces().Delete(t.Context(), testNamespace, metav1.DeleteOptions{})
				if _, err := client.CoreV1().Namespaces().Create(t.Context(), active, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: owner, Namespace: testNamespace, UID: "u1"}}
				if _, err := client.CoreV1().ConfigMaps(testNamespace).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.Check(t.Context()); err != nil {
				t.Errorf("Check once the namespace is made again: %v", err)
			}
			sb, err := p.Start(t.Context(), sandboxtest.Spec("job-2", config.SandboxSpec{}))
			if err != nil {
				t.Fatalf("Start once the namespace is made again: %v", err)
			}
			t.Cleanup(func() { _ = sb.Close(context.Background()) })
			pods, err := client.CoreV1().Pods(testNamespace).List(t.Context(), metav1.ListOptions{})
			if err != nil || len(pods.Items) != 1 {
				t.Errorf("pods after the dry runs of %d checks and one start: %d (%v), want the start's alone", dryRuns.Load(), len(pods.Items), err)
			}
		})
	}
}

// TestKubernetesNamespaceGoneWithItsRole: a sandbox namespace's deletion takes the chart's Role
// and RoleBinding in it, and then the API server's authorizer refuses every request there
// before admission could say the namespace is being deleted or gone. Start, the log and Check
// (/readyz) say what the namespace's own answer says (asked by a get of it, which the chart's
// ClusterRole grants), with the remedy, helm upgrade; they said not_permitted, "check its
// credentials and its Role", and Check that the worker may not list pods. With the namespace
// there, the Role alone gone, the refusal names helm upgrade as its remedy too.
func TestKubernetesNamespaceGoneWithItsRole(t *testing.T) {
	t.Parallel()
	deleted := metav1.Now()
	for _, tt := range []struct {
		name      string
		namespace *corev1.Namespace // nil: gone
		kind      string
		says      string // in Start's error, Check's (unless checkSays) and the log line
		checkSays string
		// noNamespaceRead: the worker may not get the namespace (a release without the
		// ClusterRole that grants it), and so cannot tell.
		noNamespaceRead bool
	}{
		{name: "namespace being deleted", kind: "namespace_terminating", says: "is being deleted",
			namespace: &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace, DeletionTimestamp: &deleted, Finalizers: []string{"x"}}, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceTerminating}}},
		{name: "namespace gone", kind: "namespace_missing", says: "does not exist"},
		{name: "the Role alone gone", kind: "not_permitted", says: "refuses the worker", checkSays: "list pods",
			namespace: &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceActive}}},
		{name: "namespace gone, and the worker may not read it", kind: "not_permitted", says: "refuses the worker", checkSays: "list pods", noNamespaceRead: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			client := fake.NewClientset()
			if tt.namespace != nil {
				if _, err := client.CoreV1().Namespaces().Create(t.Context(), tt.namespace, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			// The authorizer's refusal, as the API server words it, of every request in the namespace.
			refuse := func(a k8stesting.Action) (bool, runtime.Object, error) {
				r := a.GetResource().Resource
				return true, nil, apierrors.NewForbidden(corev1.Resource(r), "", fmt.Errorf(`User "system:serviceaccount:boxcar:boxcar" cannot %s resource %q in API group "" in the namespace %q`, a.GetVerb(), r, testNamespace))
			}
			for _, verb := range []string{"create", "list", "watch", "delete", "patch", "get"} {
				client.PrependReactor(verb, "pods", refuse)
			}
			client.PrependReactor("get", "configmaps", refuse)
			if tt.noNamespaceRead {
				client.PrependReactor("get", "namespaces", func(a k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewForbidden(corev1.Resource("namespaces"), testNamespace, errors.New(`User "system:serviceaccount:boxcar:boxcar" cannot get resource "namespaces" in API group "" in the namespace "`+testNamespace+`"`))
				})
			}
			client.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
				r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview).DeepCopy()
				r.Status.Allowed = false
				return true, r, nil
			})
			logs := &lockedBuffer{}
			p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) {
				c.Namespace = testNamespace
				c.Logger = slog.New(slog.NewTextHandler(logs, nil))
			})
			const hint = "helm upgrade"
			_, err := p.Start(t.Context(), sandboxtest.Spec("job-1", config.SandboxSpec{}))
			if !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), tt.says) || !strings.Contains(err.Error(), hint) {
				t.Errorf("Start: %v; want ErrUnavailable saying %q and %q", err, tt.says, hint)
			}
			if line := logs.String(); !strings.Contains(line, "kind="+tt.kind) || !strings.Contains(line, tt.says) || !strings.Contains(line, hint) {
				t.Errorf("log:\n%s\nwant kind=%s saying %q and %q", line, tt.kind, tt.says, hint)
			}
			err = p.Check(t.Context())
			if says := cmp.Or(tt.checkSays, tt.says); !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), hint) {
				t.Errorf("Check: %v; want the worker not ready, saying %q and %q", err, says, hint)
			}
		})
	}
}
