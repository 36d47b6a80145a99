package cluster_test

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/test/cluster"
)

// TestKubernetesReadiness runs the backend's readiness check, which the worker's /readyz
// calls, against the real API server: it passes for a worker with rights in its namespace and
// fails, saying what is missing, for one without.
func TestKubernetesReadiness(t *testing.T) {
	ns := sandboxNamespace(t)
	if err := newProvider(t, ns, "ready").Check(t.Context()); err != nil {
		t.Fatalf("Check as the cluster admin: %v", err)
	}

	// The same check as a user with no RBAC rules at all, by impersonation.
	rc := rest.CopyConfig(kube.RESTConfig)
	rc.Impersonate = rest.ImpersonationConfig{UserName: "boxcar-test-nobody"}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	p, err := sandbox.NewKubernetes(sandbox.KubernetesConfig{
		Client: client, RESTConfig: rc, Namespace: ns, Image: cluster.SandboxImage, ImagePullPolicy: corev1.PullNever,
	})
	if err != nil {
		t.Fatal(err)
	}
	err = p.Check(t.Context())
	if !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("Check without rights: err = %v, want ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), "list pods in namespace "+ns) {
		t.Errorf("Check without rights: %v; want it to name the missing permission", err)
	}
}
