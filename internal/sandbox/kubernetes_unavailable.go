package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/boxcar-run/boxcar/internal/redact"
)

// errUnschedulable: the scheduler found no node for the pod until the start gave up.
var errUnschedulable = errors.New("no node can take the pod")

// unavailableAnswer is one way the cluster says it cannot take a sandbox now, for no fault of
// the job's: Start returns it as ErrUnavailable, so that the runner waits for the backend
// (keeping the job's delivery, fetching no more jobs) instead of spending the job's
// deliveries on an outage.
type unavailableAnswer struct {
	kind  string
	why   string // what the job's status says; never the API server's address
	match func(err error) bool
	// gone: the sandbox namespace is being deleted or is gone, which only someone making it
	// again changes: Check reports the worker not ready until a pod create gets past it.
	gone bool
	// askNamespace: a namespace's deletion answers so too, before the namespace says it is
	// being deleted or gone; the namespace's own answer, when it says so, goes instead, as what
	// to do differs (wait for the deletion's end; the API server refuses helm upgrade until).
	askNamespace bool
}

// remake is what to do when the sandbox namespace or the chart's objects in it are gone.
const remake = "run helm upgrade, which makes the chart's objects there again (the namespace too with sandboxes.createNamespace=true), or make them by hand"

// unavailableAnswers are those ways, first match wins. A new one is a new row.
var unavailableAnswers = []unavailableAnswer{
	// The namespace's deletion, until it is made again: pod creates are refused (a 403 with the
	// NamespaceTerminating cause, then a 404 for the namespace), and its objects, the pods'
	// owner ConfigMap first, are deleted. No job can change that, and none may spend a delivery
	// on it one by one.
	{kind: "namespace_terminating", gone: true, why: "the sandbox namespace is being deleted, and takes no pod until it is made again: wait until `kubectl get namespace` no longer lists it (the API server refuses objects in a namespace being deleted), then " + remake,
		match: func(err error) bool { return apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) }},
	{kind: "namespace_missing", gone: true, why: "the sandbox namespace does not exist: " + remake, match: namespaceNotFound},
	// The owner ConfigMap is among the first objects a namespace's deletion removes, and a get
	// of it in a namespace that is gone is answered as if it alone were.
	{kind: "owner_missing", askNamespace: true, why: "the sandbox pods' owner ConfigMap (sandbox.kubernetes.owner) is gone from its namespace, deleted by hand or with the release, or the namespace was made again without it: " + remake,
		match: func(err error) bool { return errors.Is(err, errOwnerMissing) }},
	{kind: "quota_full", why: "the sandbox namespace's ResourceQuota is full", match: func(err error) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota")
	}},
	// Admission's 403s that pass with no change to the pod: the quota controller has not yet
	// counted the usage of a quota just made or changed, and the namespace's ServiceAccount
	// (made moments after the namespace, deleted with the chart) is not there.
	{kind: "quota_not_counted", why: "the sandbox namespace's ResourceQuota has not counted its usage yet", match: func(err error) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "status unknown for quota")
	}},
	{kind: "no_service_account", why: "the sandbox namespace has no ServiceAccount for the pod", match: func(err error) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "error looking up service account")
	}},
	// The authorizer's refusal alone: admission refusing the pod (PodSecurity, a LimitRange, a
	// webhook) is Forbidden too, but says what of the pod it refuses, and no wait changes that.
	// A namespace's deletion takes the chart's Role and RoleBinding in it, and the authorizer
	// then refuses every request there before admission could say why: unavailable asks the
	// namespace itself (goneInstead).
	{kind: "not_permitted", askNamespace: true, why: "the API server refuses the worker; check its credentials, and its Role and RoleBinding in the sandbox namespace (helm upgrade makes the chart's again)", match: notPermitted},
	{kind: "overloaded", why: "the API server asks the worker to slow down", match: apierrors.IsTooManyRequests},
	{kind: "server_error", why: "the API server failed to answer", match: func(err error) bool {
		return apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsServerTimeout(err) ||
			apierrors.IsTimeout(err) || apierrors.IsUnexpectedServerError(err)
	}},
	{kind: "unreachable", why: "the API server does not answer", match: unreachable},
	{kind: "unschedulable", why: "no node can take the sandbox pod now", match: func(err error) bool { return errors.Is(err, errUnschedulable) }},
}

// authorizerRefusal is the API server's words for a request its authorizer (RBAC) refused:
// `User "…" cannot create resource "pods" in API group "" in the namespace "…"`.
var authorizerRefusal = regexp.MustCompile(`User ".*" cannot \S+ (resource|path) "`)

// unreachable: the request got no answer at all (refused, reset, timed out, no route or name).
// Client-go passes some of these on as bare text, so the words count too; but only in an
// error of a call to the API server: what a pod's status says (podStatusError) is never the
// API server's silence, whatever its words ("i/o timeout" of an image pull).
func unreachable(err error) bool {
	var (
		status  apierrors.APIStatus
		fromPod *podStatusError
		uerr    *url.Error
		nerr    net.Error
	)
	if errors.As(err, &status) || errors.As(err, &fromPod) {
		return false
	}
	if errors.As(err, &uerr) || errors.As(err, &nerr) {
		return true
	}
	msg := err.Error()
	for _, words := range []string{"connection refused", "connection reset", "no such host", "i/o timeout", "no route to host", "TLS handshake timeout"} {
		if strings.Contains(msg, words) {
			return true
		}
	}
	return false
}

// unavailable is err, or, when it is one of unavailableAnswers, an error wrapping
// ErrUnavailable that says why in words a job's status may show: the API server's own
// message, or the last words of a connection error, never its URL. The whole error goes to
// the worker's log. An error of a start cut short by ctx stays as it is.
func (p *KubernetesProvider) unavailable(ctx context.Context, spec Spec, err error) error {
	if err == nil {
		p.noteGone(false, nil)
	}
	if err == nil || ctx.Err() != nil {
		return err
	}
	for _, a := range unavailableAnswers {
		if a.match(err) {
			detail := answerDetail(err)
			if a.askNamespace {
				if g, d, ok := p.goneInstead(ctx); ok {
					a, detail = g, d
				}
			}
			p.log.Warn("the cluster cannot take a sandbox now", "job_id", spec.JobID, "tenant", spec.Tenant, "namespace", p.cfg.Namespace, "kind", a.kind, "why", a.why, "error", err)
			err = p.answerError(a, detail)
			p.noteGone(a.gone, err)
			return err
		}
	}
	p.noteGone(false, nil)
	return err
}

// answerError is the error of a start the cluster answered a: why, and what it said (detail).
func (p *KubernetesProvider) answerError(a unavailableAnswer, detail string) error {
	return fmt.Errorf("sandbox: kubernetes: no sandbox pod can start in namespace %s now: %s (%s): %w", p.cfg.Namespace, a.why, detail, ErrUnavailable)
}

// notPermitted: the authorizer (RBAC) refused the worker, or the API server its credentials.
func notPermitted(err error) bool {
	return apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err) && authorizerRefusal.MatchString(err.Error())
}

// goneInstead is the answer of the sandbox namespace itself, asked after an answer a
// namespace's deletion gives too (askNamespace): being deleted, or gone (with what the server said), or ok false when
// it is there or the worker may not read it (the chart's ClusterRole lets it get that one
// namespace; an older release's workers may not).
func (p *KubernetesProvider) goneInstead(ctx context.Context) (unavailableAnswer, string, bool) {
	ns, err := p.cfg.Client.CoreV1().Namespaces().Get(ctx, p.cfg.Namespace, metav1.GetOptions{})
	want := ""
	switch {
	case err != nil && namespaceNotFound(err):
		want = "namespace_missing"
	case err != nil:
		return unavailableAnswer{}, "", false
	case ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating:
		want = "namespace_terminating"
	default:
		return unavailableAnswer{}, "", false
	}
	i := slices.IndexFunc(unavailableAnswers, func(a unavailableAnswer) bool { return a.kind == want })
	detail := "namespace " + p.cfg.Namespace + " is being deleted"
	if err != nil {
		detail = answerDetail(err)
	}
	return unavailableAnswers[i], detail, true
}

// goneFor is the error of a start in a namespace being deleted or gone, when err, an answer of
// an askNamespace row (nil: a review said the worker may not), came of that, else nil.
func (p *KubernetesProvider) goneFor(ctx context.Context, err error) error {
	if err != nil && !slices.ContainsFunc(unavailableAnswers, func(a unavailableAnswer) bool { return a.askNamespace && a.match(err) }) {
		return nil
	}
	a, detail, ok := p.goneInstead(ctx)
	if !ok {
		return nil
	}
	return p.answerError(a, detail)
}

// noteGone keeps the error of a start that found the sandbox namespace being deleted or gone,
// for Check, or forgets it: any other answer came from a namespace that takes pods.
func (p *KubernetesProvider) noteGone(gone bool, err error) {
	if !gone {
		err = nil
	}
	p.gone.Store(&err)
}

// namespaceNotFound: the API server refused a request in a namespace that does not exist.
func namespaceNotFound(err error) bool {
	var status apierrors.APIStatus
	if !apierrors.IsNotFound(err) || !errors.As(err, &status) {
		return false
	}
	d := status.Status().Details
	return d != nil && d.Kind == "namespaces"
}

// answerDetail is what the answer said without where it came from: an API status's message,
// or the innermost error's last words ("connection refused"), or "no answer" when those might
// name the API server (redact.ErrorWords).
func answerDetail(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status.Status().Message
	}
	if errors.Is(err, errUnschedulable) {
		return err.Error()
	}
	return redact.ErrorWords(err)
}

// unschedulableOr is err, marked errUnschedulable when the pod waited for a node: the
// scheduler's condition says so.
func unschedulableOr(pod *corev1.Pod, err error) error {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return fmt.Errorf("%w: %w", errUnschedulable, err)
		}
	}
	return err
}
