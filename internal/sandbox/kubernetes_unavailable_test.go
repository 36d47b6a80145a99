package sandbox_test

import (
	"errors"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// TestKubernetesStartUnavailable: a cluster that cannot take a sandbox now, for no fault of
// the job's, makes Start fail with ErrUnavailable, in words a job's status may show (never
// the API server's address); a fault of the pod's own does not.
func TestKubernetesStartUnavailable(t *testing.T) {
	t.Parallel()
	const apiServer = "10.96.0.1"
	pods := schema.GroupResource{Resource: "pods"}
	refused := &url.Error{Op: "Post", URL: "https://" + apiServer + ":443/api/v1/namespaces/boxcar-sandboxes/pods",
		Err: &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}}
	// What the dialer really returns: the errno's text has no "op: " before it.
	refusedErrno := &url.Error{Op: "Post", URL: "https://" + apiServer + ":443/api/v1/namespaces/boxcar-sandboxes/pods",
		Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}
	for _, tt := range []struct {
		name        string
		createErr   error
		status      *corev1.PodStatus // the fake kubelet's, when the create succeeds
		silent      bool              // the create succeeds, and no list or watch answers after it
		unavailable bool
		says        string // what the error says of the answer, when not empty
	}{
		{name: "API server unreachable", createErr: refused, unavailable: true, says: "(connection refused)"},
		{name: "API server unreachable, errno", createErr: refusedErrno, unavailable: true, says: "(connection refused)"},
		{name: "API server unreachable, as text", unavailable: true, says: "(connection refused)",
			createErr: errors.New(`Post "https://` + apiServer + `:443/api/v1/namespaces/boxcar-sandboxes/pods": dial tcp ` + apiServer + `:443: connect: connection refused`)},
		{name: "API server unreachable, as text without a cause", unavailable: true, says: "(no answer)",
			createErr: errors.New(`Post https://` + apiServer + `:443/api/v1/namespaces/boxcar-sandboxes/pods failed, connection refused`)},
		{name: "API server overloaded", createErr: apierrors.NewTooManyRequests("try again later", 1), unavailable: true},
		{name: "API server failing", createErr: apierrors.NewServiceUnavailable("etcd leader changed"), unavailable: true},
		{name: "API server internal error", createErr: apierrors.NewInternalError(errors.New("etcdserver: request timed out")), unavailable: true},
		{name: "quota full", unavailable: true,
			createErr: apierrors.NewForbidden(pods, "boxcar-x", errors.New("exceeded quota: boxcar-sandboxes, requested: pods=1, used: pods=40, limited: pods=40"))},
		{name: "RBAC refuses", unavailable: true,
			createErr: apierrors.NewForbidden(pods, "", errors.New(`User "system:serviceaccount:boxcar:worker" cannot create resource "pods"`))},
		// Admission's 403s that a wait does change, for no fault of the job's: a ResourceQuota
		// whose usage the quota controller has not counted yet (a quota just made or changed),
		// and a namespace whose ServiceAccount is not there (made moments after the namespace, or
		// deleted with the chart): failed, each job spent a delivery on them.
		{name: "quota usage not counted yet", unavailable: true, says: "status unknown for quota",
			createErr: apierrors.NewForbidden(pods, "boxcar-x", errors.New("status unknown for quota: boxcar-sandboxes, resources: pods"))},
		{name: "the namespace's ServiceAccount missing", unavailable: true, says: "error looking up service account",
			createErr: apierrors.NewForbidden(pods, "boxcar-x", errors.New(`error looking up service account boxcar-sandboxes/default: serviceaccount "default" not found`))},
		// Admission refusing the pod itself is Forbidden too, but no wait changes it: taken for
		// the worker's Role, the job waited out its start and the worker fetched nothing meanwhile.
		{name: "PodSecurity refuses the pod", says: "violates PodSecurity",
			createErr: apierrors.NewForbidden(pods, "boxcar-x", errors.New(`violates PodSecurity "restricted:latest": runAsNonRoot != true (pod must not set securityContext.runAsNonRoot=false)`))},
		{name: "a LimitRange refuses the pod", says: "maximum cpu usage",
			createErr: apierrors.NewForbidden(pods, "boxcar-x", errors.New("maximum cpu usage per Container is 2, but limit is 4"))},
		{name: "an admission webhook refuses the pod", says: "denied the request",
			createErr: apierrors.NewForbidden(pods, "boxcar-x", errors.New(`admission webhook "validation.gatekeeper.sh" denied the request: [allowed-repos] container <sandbox> has an invalid image repo <debian:12>`))},
		{name: "unschedulable", unavailable: true, status: &corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
			Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "0/3 nodes are available: 3 Insufficient cpu.",
		}}}},
		{name: "refused as invalid", createErr: apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "boxcar-x", nil)},
		{name: "image cannot be pulled", status: &corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "sandbox", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: "not found"}},
		}}}},
		// What a pod's status says is the kubelet's, the runtime's and the registry's words, never
		// the API server's answer, whatever words it uses: it was taken for an outage, and the
		// job waited as for one.
		{name: "image pull timed out", status: &corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "sandbox", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull",
				Message: `failed to pull image "registry.example/tools:1": Head "https://registry.example/v2/tools/manifests/1": dial tcp 203.0.113.5:443: i/o timeout`}},
		}}}},
		{name: "pod failed, its message a refused connection", status: &corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted",
			Message: "the node's runtime: dial unix /run/containerd/containerd.sock: connect: connection refused"}},
		// A pod still pending when the start gives up: its wait ran out (a context's deadline,
		// which is a net.Error too), no request went unanswered.
		{name: "pod still pulling at the start's bound", status: &corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "sandbox", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating",
				Message: "pulling image: TLS handshake timeout"}},
		}}}},
		// No status of the pod's ever read: the API server's silence, however the wait ends.
		{name: "API server silent after the create", silent: true, unavailable: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			client := fake.NewClientset()
			switch {
			case tt.createErr != nil:
				client.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, tt.createErr })
			case tt.silent:
				client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, refused })
				client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) { return true, nil, refused })
			default:
				fakeKubelet(t, client, func(*corev1.Pod) *corev1.PodStatus { return tt.status })
			}
			// The start's bound is the wait for a pod that never runs; where the pod's status is
			// to be read, it must pass after the informer's first list, which a busy machine
			// delays: a bound that passes first is the API server's silence, rightly.
			bound := 5 * time.Second
			if tt.silent {
				bound = 300 * time.Millisecond
			}
			p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.StartTimeout = bound })
			_, err := p.Start(t.Context(), sandboxtest.Spec("job-1", config.SandboxSpec{}))
			if err == nil {
				t.Fatal("Start succeeded")
			}
			if got := errors.Is(err, sandbox.ErrUnavailable); got != tt.unavailable {
				t.Errorf("Start: %v; ErrUnavailable %v, want %v", err, got, tt.unavailable)
			}
			if tt.unavailable && strings.Contains(err.Error(), apiServer) {
				t.Errorf("Start: %v: names the API server's address, which the job's status would show", err)
			}
			if !strings.Contains(err.Error(), tt.says) {
				t.Errorf("Start: %v; want it to say %s", err, tt.says)
			}
		})
	}
}
