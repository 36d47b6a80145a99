package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// deletePod removes a pod at once, on a context that outlives the caller's: it must happen on
// every path, during shutdown too.
func (p *KubernetesProvider) deletePod(ctx context.Context, log *slog.Logger, name string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var now int64
	policy := metav1.DeletePropagationBackground
	err := p.cfg.Client.CoreV1().Pods(p.cfg.Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &now, PropagationPolicy: &policy})
	if err != nil && !apierrors.IsNotFound(err) {
		log.Error("delete sandbox pod", "error", err)
		return fmt.Errorf("sandbox: delete pod %s: %w", name, err)
	}
	return nil
}

// ownPods selects the sandbox pods of this deployment of workers: those with its Instance label,
// or, without an Instance, those with no such label.
func (p *KubernetesProvider) ownPods() labels.Selector {
	sel := labels.SelectorFromSet(labels.Set{LabelManagedBy: managedBy, LabelComponent: componentValue})
	op, values := selection.Equals, []string{p.cfg.Instance}
	if p.cfg.Instance == "" {
		op, values = selection.DoesNotExist, nil
	}
	req, err := labels.NewRequirement(LabelInstance, op, values)
	if err != nil {
		panic(err) // validate checked Instance
	}
	return sel.Add(*req)
}

// PodJob is what a sandbox pod says of the job it runs, for the reaper's held: the job's id
// (empty for a warm pod no job has claimed yet), its tenant (empty on a pod that names none:
// one of a worker older than the label, or a warm pod claimed by one older than the claim's)
// and the worker that started it.
type PodJob struct {
	JobID, Tenant, Worker string
}

// Reap deletes the sandbox pods of this deployment (ownPods), whichever worker started them, whose job is
// no longer held: held reports whether the worker named on the pod still runs its job. Pods
// younger than minAge are spared, which covers a pod between its creation and its
// registration with its worker. A warm pod no job has claimed yet (LabelPool) is kept while a
// sandbox of this provider holds it, or, when another worker started it, while held with no
// job id holds (unclaimedPoolPod).
// It returns how many it deleted.
func (p *KubernetesProvider) Reap(ctx context.Context, held func(PodJob) bool, minAge time.Duration) (int, error) {
	list, err := p.cfg.Client.CoreV1().Pods(p.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: p.ownPods().String()})
	if err != nil {
		return 0, fmt.Errorf("sandbox: reap: list pods in %s: %w", p.cfg.Namespace, err)
	}
	var n int
	var errs []error
	for _, pod := range list.Items {
		jobID, worker := pod.Annotations[annotationJob], pod.Labels[LabelWorker]
		if pod.DeletionTimestamp != nil || time.Since(pod.CreationTimestamp.Time) < minAge {
			continue
		}
		job := PodJob{JobID: jobID, Tenant: pod.Annotations[annotationTenant], Worker: worker}
		if pool, keep := p.unclaimedPoolPod(&pod, held); keep || (!pool && held(job)) {
			continue
		}
		log := p.log.With("sandbox_id", pod.Name, "job_id", jobID, "sandbox_worker", worker)
		if err := p.deletePod(ctx, log, pod.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		log.Warn("reaped sandbox pod of a job no longer held")
		n++
	}
	return n, errors.Join(errs...)
}

// RunReaper calls Reap every interval until ctx ends; the caller owns the goroutine it runs in.
func (p *KubernetesProvider) RunReaper(ctx context.Context, interval time.Duration, held func(PodJob) bool) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := p.Reap(ctx, held, interval); err != nil && ctx.Err() == nil {
			p.log.Warn("reap sandbox pods", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
