package cluster_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
	"github.com/boxcar-run/boxcar/test/cluster"
)

// TestPodSecurityRestricted checks Boxcar's pod spec against the real API server's Pod
// Security admission at "restricted", and that the same namespace refuses pods that break it.
func TestPodSecurityRestricted(t *testing.T) {
	ns := sandboxNamespace(t)
	ctx := t.Context()
	got, err := kube.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l := got.Labels["pod-security.kubernetes.io/enforce"]; l != "restricted" {
		t.Fatalf("namespace label enforce = %q, want restricted", l)
	}

	t.Run("boxcar pod admitted", func(t *testing.T) {
		p := newProvider(t, ns, "psa")
		sb, err := p.Start(ctx, sandboxtest.Spec("psa-admitted", config.SandboxSpec{}))
		if err != nil {
			t.Fatalf("Start in a restricted namespace: %v", err)
		}
		defer sb.Close(context.WithoutCancel(ctx))
		pod, err := kube.Client.CoreV1().Pods(ns).Get(ctx, sb.Info().ID, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Status.Phase != corev1.PodRunning {
			t.Errorf("pod phase = %s, want Running", pod.Status.Phase)
		}
	})

	yes, no := true, false
	var uid int64 = 1000
	restrictedContainer := func() corev1.Container {
		return corev1.Container{
			Name: "c", Image: cluster.SandboxImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"sleep", "3600"},
			SecurityContext: &corev1.SecurityContext{
				RunAsNonRoot: &yes, RunAsUser: &uid, AllowPrivilegeEscalation: &no,
				Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
		}
	}
	tests := []struct {
		name   string
		mutate func(*corev1.Container)
	}{
		{name: "privileged", mutate: func(c *corev1.Container) {
			c.SecurityContext.Privileged = &yes
			c.SecurityContext.AllowPrivilegeEscalation = &yes
		}},
		{name: "runs as root", mutate: func(c *corev1.Container) {
			var root int64
			c.SecurityContext.RunAsUser = &root
			c.SecurityContext.RunAsNonRoot = nil
		}},
		{name: "adds a capability", mutate: func(c *corev1.Container) { c.SecurityContext.Capabilities.Add = []corev1.Capability{"NET_RAW"} }},
		{name: "no seccomp profile", mutate: func(c *corev1.Container) { c.SecurityContext.SeccompProfile = nil }},
		{name: "control: restricted pod", mutate: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := restrictedContainer()
			if tt.mutate != nil {
				tt.mutate(&c)
			}
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "psa-" + dnsName(tt.name)},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{c}, AutomountServiceAccountToken: &no},
			}
			// A dry run goes through admission, Pod Security included, and starts nothing.
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_, err := kube.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			switch {
			case tt.mutate == nil && err != nil:
				t.Fatalf("a restricted pod was refused: %v", err)
			case tt.mutate != nil && !apierrors.IsForbidden(err):
				t.Fatalf("create: err = %v, want Forbidden by Pod Security admission", err)
			case tt.mutate != nil:
				t.Logf("refused as expected: %v", err)
			}
		})
	}
}
