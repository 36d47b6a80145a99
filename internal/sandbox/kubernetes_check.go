package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/boxcar-run/boxcar/internal/config"
)

// Check reports whether the provider could start a sandbox now: the namespace is not being
// deleted or gone, as far as the last start found (stillGone), the API server answers, this
// worker may list pods in the sandbox namespace, and it may create, delete, patch and watch pods
// and create pods/exec there (refused it all, it reads the namespace: a deletion takes the
// chart's Role with it, and the remedy is to make them again, not to grant anything);
// the pods' Owner, when set, exists (looked up again each time, so that pods started after it
// was made again name its new UID).
// The worker's /readyz calls it, so that a worker that lost the cluster or its permissions is
// reported not ready. It creates nothing. What holds the worker's jobs in such an outage is
// Start's ErrUnavailable: the runner then waits for the backend and fetches no more jobs.
func (p *KubernetesProvider) Check(ctx context.Context) error {
	if err := p.stillGone(ctx); err != nil {
		return err
	}
	ns := p.cfg.Namespace
	if _, err := p.cfg.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		if gone := p.goneFor(ctx, err); gone != nil {
			return gone
		}
		return p.checkFailed("list pods", err)
	}
	if _, err := p.lookUpOwner(ctx); err != nil {
		if gone := p.goneFor(ctx, err); gone != nil {
			return gone
		}
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	var errs []error
	asked := []authorizationv1.ResourceAttributes{
		{Namespace: ns, Verb: "create", Resource: "pods"},
		{Namespace: ns, Verb: "create", Resource: "pods", Subresource: "exec"},
		{Namespace: ns, Verb: "delete", Resource: "pods"},
		{Namespace: ns, Verb: "patch", Resource: "pods"}, // a warm pod's claim names its job
		{Namespace: ns, Verb: "watch", Resource: "pods"}, // a start waits for its pod through a watch
	}
	for _, a := range asked {
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &a}}
		got, err := p.cfg.Client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			return p.checkFailed("ask the API server what this worker may do", err)
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
		// Everything refused, as when the namespace's deletion took the Role with it.
		if len(errs) == len(asked) {
			if gone := p.goneFor(ctx, nil); gone != nil {
				return gone
			}
		}
		return fmt.Errorf("sandbox: kubernetes: %w: %w", ErrUnavailable, err)
	}
	return nil
}

// checkFailed is Check's error for its call (what) that failed with err: the row of
// unavailableAnswers the answer matches says why, so that /readyz points where the cause is
// (an API server silent, overloaded or failing is no matter of the worker's Role); a refusal,
// or an answer no row knows, names the kubeconfig and the Role, which the worker's calls rest on.
func (p *KubernetesProvider) checkFailed(what string, err error) error {
	why := "check the kubeconfig, and the worker's Role and RoleBinding there; helm upgrade makes the chart's again"
	if i := slices.IndexFunc(unavailableAnswers, func(a unavailableAnswer) bool { return a.match(err) }); i >= 0 && unavailableAnswers[i].kind != "not_permitted" {
		why = unavailableAnswers[i].why
	}
	return fmt.Errorf("sandbox: kubernetes: %s in namespace %s (%s): %w: %w", what, p.cfg.Namespace, why, ErrUnavailable, err)
}

// stillGone is the error of the last start when it found the sandbox namespace being deleted or
// gone, for as long as the API server still answers so: a server-side dry run of a pod's
// create, which makes nothing and which admission answers as a start's create, asks again.
// Listing pods answers as if nothing were wrong in a namespace being deleted, and in one that
// does not exist; the authorizer, once the namespace's deletion took the chart's Role, refuses
// the dry run before admission could say why, so the namespace itself is asked (goneFor). Once the dry run is answered otherwise, Check goes on as usual.
func (p *KubernetesProvider) stillGone(ctx context.Context) error {
	last := p.gone.Load()
	if last == nil || *last == nil {
		return nil
	}
	// A sandbox pod as a start makes it: the namespace's admission is asked only of a pod that
	// passes validation (an empty image would be refused before it, and taken for an answer).
	image := cmp.Or(p.cfg.Image, p.cfg.BridgeImage, "boxcar.invalid/readyz")
	probe, err := p.podFor(Spec{JobID: "readyz", SandboxSpec: config.Profile{Sandbox: config.SandboxSpec{Image: image}}.WithDefaults().Sandbox})
	if err != nil {
		return fmt.Errorf("sandbox: kubernetes: ask whether namespace %s takes pods again: %w", p.cfg.Namespace, err)
	}
	_, err = p.cfg.Client.CoreV1().Pods(p.cfg.Namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil && (slices.ContainsFunc(unavailableAnswers, func(a unavailableAnswer) bool { return a.gone && a.match(err) }) || p.goneFor(ctx, err) != nil) {
		return *last
	}
	if ctx.Err() == nil {
		p.gone.CompareAndSwap(last, nil)
	}
	return nil
}
