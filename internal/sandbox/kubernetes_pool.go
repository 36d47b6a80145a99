package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

var _ Claimer = (*kubernetesSandbox)(nil)

// A pool pod (Spec.Pool) is labelled with its profile and annotated with the run of the
// worker process that started it, so that the reaper can tell a warm pod its worker still
// keeps from one an earlier run of that worker left behind. Until its claim it names no job.
const (
	LabelPool     = "boxcar.run/pool"
	annotationRun = "boxcar.run/worker-run"
)

// poolPod makes pod a warm pod of spec.Pool: a name and labels of the pool's, no job, and a
// deadline that leaves Ahead to wait for the claim on top of the lifetime (Claim shortens it).
func (p *KubernetesProvider) poolPod(pod *corev1.Pod, spec Spec) {
	if spec.Pool == "" {
		return
	}
	name := "boxcar-pool-" + strings.Trim(dnsUnsafe.ReplaceAllString(strings.ToLower(spec.Pool), "-"), "-")
	if len(name) > 40 {
		name = strings.TrimRight(name[:40], "-")
	}
	pod.Name = name + "-" + randomHex(4)
	delete(pod.Labels, LabelJobID)
	delete(pod.Annotations, annotationJob)
	pod.Labels[LabelPool] = validLabel(spec.Pool)
	pod.Annotations[annotationRun] = p.run
	deadline := max(int64((spec.Ahead + time.Duration(spec.Lifetime)).Seconds()), 1)
	pod.Spec.ActiveDeadlineSeconds = &deadline
}

// unclaimedPoolPod reports whether the reaper must judge pod as a warm pod no job has
// claimed, and whether it keeps it: this worker run's own while one of its sandboxes holds it
// (poolPods), another worker's while held (with no job id) says that worker lives; an earlier run's
// never. A warm pod of this run that no sandbox holds (its start failed and so did the delete
// on that path, or its Close's delete failed) is an orphan nothing else would delete before
// the worker stops.
func (p *KubernetesProvider) unclaimedPoolPod(pod *corev1.Pod, held func(PodJob) bool) (pool, keep bool) {
	if pod.Labels[LabelPool] == "" || pod.Annotations[annotationJob] != "" {
		return false, false
	}
	worker := pod.Labels[LabelWorker]
	if worker == p.cfg.WorkerID {
		return true, pod.Annotations[annotationRun] == p.run && p.poolPods.has(pod.Name)
	}
	return true, held(PodJob{Worker: worker})
}

// podSet is a set of pod names, safe for concurrent use.
type podSet struct {
	mu    sync.Mutex
	names map[string]bool
}

func (s *podSet) add(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.names[name] = true
}

func (s *podSet) remove(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.names, name)
}

func (s *podSet) has(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.names[name]
}

// Claim binds the warm pod to its job with one patch: the job's and its tenant's labels and
// annotations, as a pod started for the job has (the reaper asks about the job in its tenant),
// and a deadline of the lifetime from now (a pod's deadline may only shrink, and this one does:
// it was started with Ahead to spare).
//
// A pod with a command session that answers is claimed without waiting for the patch: the
// session's answer (a ping, one round trip to the bridge in the pod) proves what the patch's
// answer would, that the pod's container still runs, and the patch goes on while the job's
// first steps run. Nothing the job does depends on it: the pod's commands, files and egress
// are the worker's, through the session; a reaper keeps an unclaimed warm pod of a live
// worker run as it keeps a claimed one, and deletes either once its run is gone; the deadline
// only shrinks. It is a call on the sandbox: Close stops it (the pod goes) and waits for it.
func (s *kubernetesSandbox) Claim(ctx context.Context, tenant, jobID string) error {
	waited := time.Since(s.created)
	deadline := s.claimDeadline(waited)
	labels, annotations := map[string]string{LabelJobID: validLabel(jobID)}, map[string]string{annotationJob: jobID}
	if tenant != "" {
		labels[LabelTenant], annotations[annotationTenant] = validLabel(tenant), tenant
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"labels": labels, "annotations": annotations},
		"spec":     map[string]any{"activeDeadlineSeconds": deadline},
	})
	if err != nil {
		return fmt.Errorf("sandbox: claim %s: %w", s.name, err)
	}
	pctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	id, err := s.begin(cancel)
	if err != nil {
		cancel(nil)
		return fmt.Errorf("sandbox: claim %s: %w", s.name, err)
	}
	if s.cmds != nil && s.cmds.Ping(ctx) == nil {
		s.claimed(tenant, jobID, deadline, waited)
		go func() {
			defer s.end(id)
			defer cancel(nil)
			if _, err := s.patch(pctx, patch); err != nil {
				s.log.Warn("the claim's patch failed: the pod does not name its job", "error", err)
			}
		}()
		return nil
	}
	defer s.end(id)
	defer cancel(nil)
	pod, err := s.patch(ctx, patch)
	if err != nil {
		return fmt.Errorf("sandbox: claim %s for job %s: patch the pod: %w", s.name, jobID, err)
	}
	if pod.Status.Phase != corev1.PodRunning {
		return fmt.Errorf("sandbox: claim %s: the pod is %s, no longer running: %w", s.name, pod.Status.Phase, ErrClosed)
	}
	s.claimed(tenant, jobID, deadline, waited)
	return nil
}

// claimDeadline is the pod's deadline for its job, counted from before the pod was created,
// so the job has at least its lifetime, but never beyond the deadline the pod has: the API
// server refuses to raise activeDeadlineSeconds ("must be less than or equal to previous
// value"), and a pod claimed more than Ahead after its start (the pool keeps it for max_age
// from its start's beginning; the claim comes a moment after the take) keeps what is left.
func (s *kubernetesSandbox) claimDeadline(waited time.Duration) int64 {
	d := int64((waited + s.lifetime + time.Second - 1).Seconds())
	if has := s.pod.Spec.ActiveDeadlineSeconds; has != nil {
		d = min(d, *has)
	}
	return d
}

func (s *kubernetesSandbox) patch(ctx context.Context, patch []byte) (*corev1.Pod, error) {
	return s.p.cfg.Client.CoreV1().Pods(s.p.cfg.Namespace).Patch(ctx, s.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
}

// claimed records the claim: the job in the sandbox's logs, and in its isolation the deadline
// the job has, counted from the claim as a cold pod's counts from its start: the pod's own
// counts from before it was created (deadline, waited included), and the manifest of a warm
// job said active_deadline=1201s, or 1800s after a 10-minute wait, where a cold one's said
// 1200s. Less than the lifetime only when the pod's deadline left the job less
// (claimDeadline).
func (s *kubernetesSandbox) claimed(tenant, jobID string, deadline int64, waited time.Duration) {
	pod := s.pod.DeepCopy()
	left := deadline - int64((waited + time.Second - 1).Seconds())
	pod.Spec.ActiveDeadlineSeconds = &left
	s.info.Isolation = s.p.isolationOf(pod)
	s.log = s.log.With("job_id", jobID, "tenant", tenant)
	s.log.Info("sandbox claimed")
}
