package runner_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
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
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
	"github.com/boxcar-run/boxcar/test/harness"
)

// runningAtCreate has the fake API server create every pod running, as a kubelet would make it.
func runningAtCreate(a k8stesting.Action) (bool, runtime.Object, error) {
	pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
		Name: "sandbox", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
	}}}
	return false, nil, nil
}

// TestKubernetesOutageHoldsJobs: while the cluster cannot take a sandbox (its API server does
// not answer, is overloaded, or the namespace's quota is full), the job that found it so waits
// with its delivery kept, its status saying why without the API server's address, and the
// worker fetches no other job; once the cluster answers, both run. Without that, each delivery
// failed in milliseconds and the next followed after retry_backoff: every queued job was dead
// with max_deliveries within a minute or two of an outage.
func TestKubernetesOutageHoldsJobs(t *testing.T) {
	t.Parallel()
	const apiServer = "10.96.0.1"
	for _, tt := range []struct {
		name  string
		verbs []string
		err   error
	}{
		{name: "API server unreachable", verbs: []string{"create", "list", "watch", "get", "delete"},
			err: errors.New(`Post "https://` + apiServer + `:443/api/v1/namespaces/boxcar-sandboxes/pods": dial tcp ` + apiServer + `:443: connect: connection refused`)},
		{name: "API server overloaded", verbs: []string{"create"},
			err: apierrors.NewTooManyRequests("the server has received too many requests and has asked us to try again later", 1)},
		{name: "quota full", verbs: []string{"create"},
			err: apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "boxcar-x", errors.New("exceeded quota: boxcar-sandboxes, requested: pods=1, used: pods=40, limited: pods=40"))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cs := fake.NewClientset()
			var down atomic.Bool
			down.Store(true)
			cs.PrependReactor("create", "pods", runningAtCreate)
			for _, verb := range tt.verbs {
				cs.PrependReactor(verb, "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
					if down.Load() {
						return true, nil, tt.err
					}
					return false, nil, nil
				})
			}
			kp, err := sandbox.NewKubernetes(sandbox.KubernetesConfig{Client: cs, Executor: &sandboxtest.LostExec{}, Image: "busybox:1.37", WorkerID: "w1"})
			if err != nil {
				t.Fatal(err)
			}
			b.cfg.Concurrency = 3
			var fetches *fetchesWhile
			b.worker(agentFunc(func(context.Context, agent.Request) (agent.Result, error) {
				return agent.Result{Outcome: agent.OutcomeCompleted, FinalMessage: "done"}, nil
			}), func(c *runner.Config) {
				c.Sandboxes = kp
				fetches = &fetchesWhile{Queue: c.Queue, cond: down.Load}
				c.Queue = fetches
			})
			waiting := func(id string) {
				t.Helper()
				var st job.Status
				waitFor(t, 10*time.Second, "the job to wait for the sandbox backend", func() bool {
					st, err = b.q.Status(t.Context(), id)
					return err == nil && strings.Contains(st.Error, "waiting for the sandbox backend")
				})
				if strings.Contains(st.Error, apiServer) {
					t.Errorf("the job's status names the API server's address: %q", st.Error)
				}
			}
			first := b.submit("p")
			waiting(first.ID)
			// The fetch already waiting when the outage was found is left to end (cancelling a
			// pull can lose its message): it takes the next job, which waits too.
			second := b.submit("p")
			waiting(second.ID)
			// The worker has a free slot, but asks for no job while the backend is unavailable:
			// the fetch loop went on to its next fetch as it handed the second job over, long
			// before that job's attempt found the outage and said so.
			third := b.submit("p")
			if n := fetches.began.Load(); n != 2 {
				t.Errorf("the worker began %d fetches during the outage; want the 2 that took the first two jobs", n)
			}
			down.Store(false)
			for _, j := range []job.Job{first, second, third} {
				if st := b.waitFinal(j.ID, 30*time.Second); st.State != job.StateSucceeded || st.Attempt != 1 {
					t.Errorf("job %s ended %s on attempt %d (%s); want succeeded on its first, once the cluster answered", j.ID, st.State, st.Attempt, st.Error)
				}
			}
		})
	}
}

// fetchesWhile counts the fetches the worker begins while cond holds.
type fetchesWhile struct {
	runner.Queue
	cond  func() bool
	began atomic.Int32
}

func (q *fetchesWhile) Fetch(ctx context.Context) (*queue.Delivery, error) {
	if q.cond() {
		q.began.Add(1)
	}
	return q.Queue.Fetch(ctx)
}

// TestKubernetesPodLostMidJob: the sandbox pod goes away under a running job (deleted by a
// node drain or a preemption, evicted). Every later call on it fails; the job must not be
// committed and signed as succeeded with the model's "I could not run make" as its report
// (which it was): a pod lost for the platform's reasons is retried, and each attempt here
// loses its pod, so the job ends dead; a pod evicted for passing its workdir's disk bound is
// a cap the job hit.
func TestKubernetesPodLostMidJob(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		lose   func(ctx context.Context, cs *fake.Clientset, pod *corev1.Pod) error
		answer func(pod string) error
		state  job.State
		cap    string
	}{
		{name: "deleted", state: job.StateDead,
			lose: func(ctx context.Context, cs *fake.Clientset, pod *corev1.Pod) error {
				return cs.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{})
			},
			answer: func(pod string) error { return apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, pod) }},
		{name: "evicted over its workdir's bound", state: job.StateCapped, cap: "disk",
			lose: func(ctx context.Context, cs *fake.Clientset, pod *corev1.Pod) error {
				pod.Status = corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: `Usage of EmptyDir volume "workdir" exceeds the limit "1Gi". `}
				_, err := cs.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
				return err
			},
			answer: func(string) error { return errors.New(`container not found ("sandbox")`) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cs := fake.NewClientset()
			cs.PrependReactor("create", "pods", runningAtCreate)
			ex := &sandboxtest.LostExec{}
			kp, err := sandbox.NewKubernetes(sandbox.KubernetesConfig{Client: cs, Executor: ex, Image: "busybox:1.37", WorkerID: "w1"})
			if err != nil {
				t.Fatal(err)
			}
			b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
				if err := req.Sandbox.WriteFile(ctx, "report.md", []byte("# half done\n")); err != nil {
					return agent.Result{}, err
				}
				pods, err := cs.CoreV1().Pods("boxcar-sandboxes").List(ctx, metav1.ListOptions{})
				if err != nil || len(pods.Items) != 1 {
					return agent.Result{}, errors.New("want the job's one pod")
				}
				if err := tt.lose(ctx, cs, &pods.Items[0]); err != nil {
					return agent.Result{}, err
				}
				answer := tt.answer(pods.Items[0].Name)
				ex.Answer.Store(&answer)
				_, _ = req.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: []string{"make", "report"}})
				ex.Answer.Store(nil) // the next attempt's pod runs, until it too is lost
				// What a model told that its command "could not run" may well answer.
				return agent.Result{Outcome: agent.OutcomeCompleted, FinalMessage: "I could not run make; here is what I have."}, nil
			}), func(c *runner.Config) { c.Sandboxes = kp })
			j := b.submit("p")
			st := b.waitFinal(j.ID, 20*time.Second)
			if st.State != tt.state || st.Cap != tt.cap {
				t.Errorf("job whose sandbox pod was lost mid-run ended %s (cap %q, attempt %d: %s); want %s (cap %q)", st.State, st.Cap, st.Attempt, st.Error, tt.state, tt.cap)
			}
		})
	}
}

// TestKubernetesStartFailureNamesNoNode: a sandbox pod that cannot start (the kubelet rejects it,
// its image cannot be pulled) ends the job dead after its deliveries, and what its tenant reads
// of it (every status, the dead letter, the manifest and its transcript line) names neither the
// node, nor the kubelet's paths, nor the registry's address in the pod's status: those go to
// the worker's log, on a line with the job's id and tenant.
func TestKubernetesStartFailureNamesNoNode(t *testing.T) {
	t.Parallel()
	const node, kubelet, registry = "node-7.rack3.corp.internal", "/var/lib/kubelet/pods/0c1f", "registry.corp.internal:5000"
	for _, tt := range []struct {
		name   string
		status corev1.PodStatus
	}{
		{"rejected by its node", corev1.PodStatus{Phase: corev1.PodFailed, Reason: "UnexpectedAdmissionError",
			Message: "Pod was rejected: Allocate failed on node " + node + ": mkdir " + kubelet + "/volumes: read-only file system"}},
		{"image not pulled", corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "sandbox", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull",
				Message: "failed to pull " + registry + "/busybox:1.37 on " + node + ": rpc error: code = NotFound desc = manifest unknown (" + kubelet + ")"}},
		}}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cs := fake.NewClientset()
			cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				a.(k8stesting.CreateAction).GetObject().(*corev1.Pod).Status = tt.status
				return false, nil, nil
			})
			kp, err := sandbox.NewKubernetes(sandbox.KubernetesConfig{Client: cs, Executor: &sandboxtest.LostExec{}, Image: "busybox:1.37", WorkerID: "w1"})
			if err != nil {
				t.Fatal(err)
			}
			var logs harness.LogBuffer
			b.worker(agentFunc(writeReport), func(c *runner.Config) {
				c.Sandboxes, c.Logger = kp, slog.New(slog.NewJSONHandler(&logs, nil))
			})
			j := b.submit("p")
			seen := b.statusesUntilFinal(j.ID, time.Minute)
			hostPaths{node, kubelet, registry}.notIn(t, seen...)
			hostPaths{node}.inALogLine(t, logs.String(), j.ID, "default")
		})
	}
}
