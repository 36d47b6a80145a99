package sandbox

import (
	"context"
	"errors"
	"fmt"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Check reports whether the provider could start a sandbox now: the API server answers, this
// worker may list pods in the sandbox namespace, and it may create pods and pods/exec there;
// the pods' Owner, when set, exists (looked up again each time, so that pods started after it
// was made again name its new UID).
// The worker's /readyz calls it, so that a worker that lost the cluster or its permissions is
// reported not ready. It creates nothing. What holds the worker's jobs in such an outage is
// Start's ErrUnavailable: the runner then waits for the backend and fetches no more jobs.
func (p *KubernetesProvider) Check(ctx context.Context) error {
	ns := p.cfg.Namespace
	if _, err := p.cfg.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return fmt.Errorf("sandbox: kubernetes: list pods in namespace %s (check the kubeconfig and the worker's Role): %w: %w", ns, ErrUnavailable, err)
	}
	if _, err := p.lookUpOwner(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	var errs []error
	for _, a := range []authorizationv1.ResourceAttributes{
		{Namespace: ns, Verb: "create", Resource: "pods"},
		{Namespace: ns, Verb: "create", Resource: "pods", Subresource: "exec"},
		{Namespace: ns, Verb: "delete", Resource: "pods"},
		{Namespace: ns, Verb: "patch", Resource: "pods"}, // a warm pod's claim names its job
	} {
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &a}}
		got, err := p.cfg.Client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("sandbox: kubernetes: ask the API server what this worker may do in namespace %s: %w: %w", ns, ErrUnavailable, err)
		}
		if !got.Status.Allowed {
			what := a.Verb + " " + a.Resource
			if a.Subresource != "" {
				what += "/" + a.Subresource
			}
			errs = append(errs, fmt.Errorf("may not %s in namespace %s (%s): grant it in the worker's Role", what, ns, got.Status.Reason))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sandbox: kubernetes: %w: %w", ErrUnavailable, err)
	}
	return nil
}
