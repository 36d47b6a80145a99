package sandbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// lostLookup bounds the look at a lost pod for why it went.
const lostLookup = 5 * time.Second

// diskEvictions are the kubelet's words for evicting a pod over its own disk bounds: the
// workdir's emptyDir past its sizeLimit, the container or the pod past its ephemeral-storage
// limit (the workdir and /tmp). The job filled them: a cap it hit, not the platform's fault.
// A node short of disk ("The node was low on resource: ephemeral-storage") is not among them.
var diskEvictions = []string{
	"exceeds the limit",                          // Usage of EmptyDir volume "workdir" exceeds the limit "1Gi".
	"exceeded its local ephemeral storage limit", // Container sandbox exceeded its local ephemeral storage limit "1Gi".
	"ephemeral local storage usage exceeds",      // Pod ephemeral local storage usage exceeds the total limit of containers 1Gi.
}

// lostError is the error of a call that found the pod gone (gone is podGone's kind): it wraps
// ErrSandboxLost, and ErrDiskFull too when the kubelet evicted the pod for its disk use. It
// says why the pod went as far as the API server still knows.
func (s *kubernetesSandbox) lostError(ctx context.Context, op, gone string) error {
	why, overDisk := s.whyGone(ctx)
	msg := fmt.Sprintf("sandbox: %s: the sandbox's pod %s is gone (%s", op, s.name, gone)
	if why != "" {
		msg += ": " + why
	}
	msg += "); the job's work in it is lost"
	if overDisk {
		return fmt.Errorf("%s: %w: %w", msg, ErrDiskFull, ErrSandboxLost)
	}
	return fmt.Errorf("%s: %w", msg, ErrSandboxLost)
}

// whyGone reads the pod's status for why it went, and whether that was an eviction over its
// disk bounds. A pod no longer there says nothing more than that.
func (s *kubernetesSandbox) whyGone(ctx context.Context) (why string, overDisk bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lostLookup)
	defer cancel()
	pod, err := s.p.cfg.Client.CoreV1().Pods(s.p.cfg.Namespace).Get(ctx, s.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "deleted: a node drain, a preemption, an eviction or by hand", false
	case err != nil:
		return "", false
	}
	reason, message := pod.Status.Reason, strings.TrimSpace(pod.Status.Message)
	if reason == "" {
		reason = strings.ToLower(string(pod.Status.Phase))
	}
	why = reason
	if message != "" {
		why += ": " + message
	}
	if pod.DeletionTimestamp != nil {
		why += " (being deleted)"
	}
	if reason == "Evicted" {
		for _, words := range diskEvictions {
			if strings.Contains(message, words) {
				return why, true
			}
		}
	}
	return why, false
}
