package runner_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

type auditNoExec struct{}

func (auditNoExec) Exec(context.Context, string, string, []string, io.Reader, io.Writer, io.Writer) error {
	return errors.New("no kubelet in this test")
}

// TestAuditK8sAPIServerOutageKillsJobs: KubernetesProvider.Check says "a worker that lost the
// cluster or its permissions stops taking jobs instead of failing each one", but nothing acts on
// Check except /readyz, which a NATS pull worker's fetch loop never reads (unlike the model's
// gate, which holds the fetch loop: TestModelOutageKillsNoJob). And Start's errors for an API
// server that does not answer (or refuses the worker: RBAC) are not sandbox.ErrUnavailable, so
// not even the runner's "sandbox backend unavailable" row (retry after a minute) applies: each
// delivery fails in milliseconds as a plain transient fault and the next one follows after
// retry_backoff (5s doubling by default: 5 deliveries in about 75 s). An API server outage
// shorter than a control-plane upgrade turns every queued job dead with max_deliveries.
func TestAuditK8sAPIServerOutageKillsJobs(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		verbs []string
		err   error
	}{
		{name: "API server unreachable", verbs: []string{"create", "list", "watch", "get", "delete"},
			err: errors.New(`Post "https://10.96.0.1:443/api/v1/namespaces/boxcar-sandboxes/pods": dial tcp 10.96.0.1:443: connect: connection refused`)},
		{name: "API server overloaded", verbs: []string{"create"},
			err: apierrors.NewTooManyRequests("the server has received too many requests and has asked us to try again later", 1)},
		// The sandbox namespace's ResourceQuota is full (more workers x concurrency + warm
		// pods than sandboxes.resourceQuota.hard.pods): capacity, not a fault of the job.
		{name: "quota full", verbs: []string{"create"},
			err: apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "boxcar-x", errors.New("exceeded quota: boxcar-sandboxes, requested: pods=1, used: pods=40, limited: pods=40"))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cs := fake.NewClientset()
			for _, verb := range tt.verbs {
				cs.PrependReactor(verb, "pods", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, tt.err })
			}
			kp, err := sandbox.NewKubernetes(sandbox.KubernetesConfig{Client: cs, Executor: auditNoExec{}, Image: "busybox:1.37", WorkerID: "w1"})
			if err != nil {
				t.Fatal(err)
			}
			b.worker(agentFunc(func(context.Context, agent.Request) (agent.Result, error) {
				return agent.Result{Outcome: agent.OutcomeCompleted, FinalMessage: "done"}, nil
			}), func(c *runner.Config) { c.Sandboxes = kp })
			j := b.submit("p")
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			updates, err := b.q.WatchStatus(ctx, j.ID)
			if err != nil {
				t.Fatal(err)
			}
			var last job.Status
			for st := range updates {
				last = st
				if st.State.Terminal() {
					cancel()
				}
			}
			if last.State.Terminal() {
				t.Errorf("job %s ended %s (%s, attempt %d) within seconds of a cluster-side outage: each delivery failed at once and the next followed after retry_backoff; want it held until the cluster answers (as the model gate holds jobs)", j.ID, last.State, last.Error, last.Attempt)
			}
		})
	}
}

// goneExec plays pods/exec for a pod that is evicted once gone is set: before, every script
// succeeds (the inputs are written); after, the API server answers that the pod is not found,
// as it does for a pod evicted (node pressure, its own emptyDir past sizeLimit), preempted,
// deleted by a node drain, or ended by its activeDeadlineSeconds and removed.
type goneExec struct{ gone chan struct{} }

func (g goneExec) Exec(_ context.Context, _, pod string, _ []string, stdin io.Reader, _, _ io.Writer) error {
	select {
	case <-g.gone:
		return apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, pod)
	default:
		if stdin != nil {
			_, _ = io.Copy(io.Discard, stdin)
		}
		return nil
	}
}

// TestAuditK8sPodLostMidJobCommitsSucceeded: the sandbox pod goes away under a running job.
// Every later command and file operation fails with "pods not found", which nothing treats as
// the sandbox being lost: the agent's tools report "could not run" to the model, the report
// read fails as "report_unreadable" (the model's final message becomes the report), the
// artifact listing fails as "unreadable" (no artifacts), and the run is committed and signed
// as succeeded, its work lost. A lost sandbox is the platform's fault (or, for an eviction
// past the workdir's sizeLimit, a cap the job hit), never a success.
func TestAuditK8sPodLostMidJobCommitsSucceeded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cs := fake.NewClientset()
	cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "sandbox", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
		}}}
		return false, nil, nil
	})
	ex := goneExec{gone: make(chan struct{})}
	kp, err := sandbox.NewKubernetes(sandbox.KubernetesConfig{Client: cs, Executor: ex, Image: "busybox:1.37", WorkerID: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		if err := req.Sandbox.WriteFile(ctx, "report.md", []byte("# half done\n")); err != nil {
			return agent.Result{}, err
		}
		// The node evicts the pod.
		close(ex.gone)
		if pods, err := cs.CoreV1().Pods("boxcar-sandboxes").List(ctx, metav1.ListOptions{}); err == nil {
			for _, p := range pods.Items {
				_ = cs.CoreV1().Pods("boxcar-sandboxes").Delete(ctx, p.Name, metav1.DeleteOptions{})
			}
		}
		res, err := req.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: []string{"make", "report"}})
		t.Logf("the command after the eviction: %+v, %v", res, err)
		return agent.Result{Outcome: agent.OutcomeCompleted, FinalMessage: "I could not run make; here is what I have."}, nil
	}), func(c *runner.Config) { c.Sandboxes = kp })
	j := b.submit("p")
	st := b.waitFinal(j.ID, 20*time.Second)
	if st.State == job.StateSucceeded {
		m := b.manifest(j.ID)
		t.Errorf("job whose sandbox pod was lost mid-run ended %s; manifest outcome %+v, collected %+v: want it retried (or failed), not a signed success", st.State, m.Predicate.Outcome, m.Predicate.Collected)
	}
}
