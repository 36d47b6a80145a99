package sandbox

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

// errPodDeleted: the pod went, or began to go, before it ran (the garbage collector,
// someone else's delete).
var errPodDeleted = errors.New("pod was deleted while starting")

// podStatusError is an error made of what a pod's status says (its containers' waiting and
// terminated messages, its phase, its conditions, or that it was not running when its wait
// ended): the kubelet's, the runtime's and the registry's words, never an answer of the API
// server's (unreachable).
type podStatusError struct{ err error }

func (e *podStatusError) Error() string { return e.err.Error() }
func (e *podStatusError) Unwrap() error { return e.err }

// failFast are the container waiting reasons that will not resolve by waiting.
var failFast = map[string]bool{
	"ErrImagePull": true, "ImagePullBackOff": true, "InvalidImageName": true, "ErrImageNeverPull": true,
	"CreateContainerConfigError": true, "CreateContainerError": true, "RunContainerError": true,
	"CrashLoopBackOff": true,
}

// podState says whether the pod runs, cannot run (err), or may still get there.
func podState(pod *corev1.Pod) (running bool, err error) {
	// The container says more than the pod: a pod whose container could not start is only
	// "Failed", with no reason of its own. An init container (the egress bridge) that cannot
	// start holds the pod in Pending, its sandbox container waiting in PodInitializing, for
	// good: it is read first, with the same table.
	for _, cs := range pod.Status.InitContainerStatuses {
		if err := cannotStart("init container", cs, initHint); err != nil {
			return false, err
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if err := cannotStart("container", cs, imageHint); err != nil {
			return false, err
		}
	}
	switch pod.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		return false, fmt.Errorf("pod ended (%s) before it was used: %s %s", pod.Status.Phase, pod.Status.Reason, pod.Status.Message)
	}
	if pod.DeletionTimestamp != nil {
		return false, errPodDeleted
	}
	if pod.Status.Phase != corev1.PodRunning {
		return false, nil
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == containerName && cs.State.Running != nil {
			return true, nil
		}
	}
	return false, nil
}

// cannotStart is the error of a container (kind: "container" or "init container") that will
// not run by waiting: waiting for a failFast reason, or ended; hint adds advice on the
// message. An init container that ended with code 0 did its work.
func cannotStart(kind string, cs corev1.ContainerStatus, hint func(string) string) error {
	if w := cs.State.Waiting; w != nil && failFast[w.Reason] {
		return fmt.Errorf("%s %s cannot start: %s: %s%s", kind, cs.Name, w.Reason, w.Message, hint(w.Message))
	}
	if t := cs.State.Terminated; t != nil && (kind == "container" || t.ExitCode != 0) {
		return fmt.Errorf("%s %s exited (%s, code %d): %s%s", kind, cs.Name, t.Reason, t.ExitCode, t.Message, hint(t.Message))
	}
	return nil
}

// imageHint adds advice when the runtime could not find the container's program: the sandbox
// container runs sh.
func imageHint(msg string) string {
	if missingShell(msg) {
		return " (the sandbox container runs sh: use an image with a POSIX sh on its PATH)"
	}
	return ""
}

// initHint says what the init container runs: the worker's own image, which the sandbox
// namespace must be able to pull.
func initHint(string) string {
	return " (the init container copies the egress bridge from the worker's image, sandbox.kubernetes.bridge_image: check its tag, and that sandbox pods may pull it, sandbox.kubernetes.image_pull_secrets naming a Secret in the sandbox namespace)"
}

// pending explains why a pod still waits, for the error when the wait gives up.
func pending(pod *corev1.Pod) string {
	for _, c := range pod.Status.Conditions {
		if c.Status == corev1.ConditionFalse && c.Message != "" {
			return fmt.Sprintf("%s: %s: %s", c.Type, c.Reason, c.Message)
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			return fmt.Sprintf("container %s waiting: %s %s", cs.Name, w.Reason, w.Message)
		}
	}
	return "phase " + string(pod.Status.Phase)
}

// waitRunning watches the pod until it runs, fails, or ctx (bounded by StartTimeout) ends.
// client-go's UntilWithSync lists, then watches from the list's version, and re-lists when a
// watch breaks or its version expires, so no change of the pod's is missed.
func (p *KubernetesProvider) waitRunning(ctx context.Context, name string) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	pods := p.cfg.Client.CoreV1().Pods(p.cfg.Namespace)
	selector := fields.OneTermEqualSelector("metadata.name", name).String()
	// The wrapper tells the informer whether the client can stream the initial list (a fake
	// clientset cannot), so that it lists instead of waiting for a stream that never comes.
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = selector
			return pods.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = selector
			return pods.Watch(ctx, opts)
		},
	}, p.cfg.Client)
	last := &corev1.Pod{}
	var running *corev1.Pod
	seen := false // the pod's status was read at least once
	check := func(pod *corev1.Pod) (bool, error) {
		last, seen = pod, true
		ok, err := podState(pod)
		if ok {
			running = pod
		}
		if err != nil {
			err = &podStatusError{err}
		}
		return ok, err
	}
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{},
		func(store cache.Store) (bool, error) {
			obj, exists, err := store.GetByKey(p.cfg.Namespace + "/" + name)
			if err == nil && exists {
				return check(obj.(*corev1.Pod))
			}
			// The informer's first list may come from the API server's watch cache, which
			// can lag behind the create on a busy server: ask for a consistent list before
			// taking the pod for deleted.
			list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: selector})
			if err != nil || len(list.Items) == 0 {
				return false, errPodDeleted
			}
			return check(&list.Items[0])
		},
		func(ev watch.Event) (bool, error) {
			pod, isPod := ev.Object.(*corev1.Pod)
			switch {
			case !isPod || pod.Name != name:
				return false, nil // a server that ignores the field selector
			case ev.Type == watch.Deleted:
				return false, errPodDeleted
			}
			return check(pod)
		})
	switch {
	case running != nil:
		return running, nil
	case ctx.Err() != nil && !seen:
		// No list or watch ever answered: the API server's silence, not the pod's (unreachable).
		return nil, fmt.Errorf("not running after waiting (the API server never showed the pod): %w", ctx.Err())
	case ctx.Err() != nil:
		return nil, &podStatusError{fmt.Errorf("not running after waiting (%s): %w", pending(last), unschedulableOr(last, ctx.Err()))}
	case err == nil:
		err = errors.New("the watch ended before the pod ran")
	}
	return nil, err
}
