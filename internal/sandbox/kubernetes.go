package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/boxcar-run/boxcar/internal/config"
)

var (
	_ Provider = (*KubernetesProvider)(nil)
	_ Sandbox  = (*kubernetesSandbox)(nil)
)

// Labels on every sandbox pod. The chart's deny-all NetworkPolicy selects the component label.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelComponent = "app.kubernetes.io/component"
	LabelJobID     = "boxcar.run/job-id" // the job id made label-safe; the annotation holds it whole
	LabelWorker    = "boxcar.run/worker"

	managedBy      = "boxcar"
	componentValue = "sandbox"
	annotationJob  = "boxcar.run/job-id"
	containerName  = "sandbox"
)

// PodExecutor runs one command in a pod's container and streams its input and output. A
// non-zero exit comes back as an error implementing k8s.io/client-go/util/exec.ExitError.
// The default goes through the pods/exec subresource; tests substitute their own.
type PodExecutor interface {
	Exec(ctx context.Context, namespace, pod string, argv []string, stdin io.Reader, stdout, stderr io.Writer) error
}

// KubernetesConfig configures the pod backend.
type KubernetesConfig struct {
	// Client talks to the API server. Required.
	Client kubernetes.Interface
	// RESTConfig opens pods/exec streams (the typed client cannot stream): the exec URL, the
	// TLS settings and the credentials all come from it. Required unless Executor is set.
	RESTConfig *rest.Config
	// Executor runs commands in pods. Default: pods/exec over WebSocket, falling back to SPDY
	// when the server cannot upgrade.
	Executor PodExecutor
	// Namespace holds the sandbox pods; it should hold nothing else. Default: boxcar-sandboxes.
	Namespace string
	// Image is used when a profile names none. Optional; then every profile must name one.
	Image string
	// ImagePullPolicy of sandbox pods. Default: IfNotPresent.
	ImagePullPolicy corev1.PullPolicy
	// WorkerID labels the pods this worker starts. Default: "boxcar".
	WorkerID string
	// UID and GID the container runs as. Default: 1000. Never 0: pods run as non-root.
	UID, GID int64
	// TmpSize bounds the container's /tmp (an emptyDir; the root filesystem is read-only).
	// Default: 64Mi.
	TmpSize string
	// StartTimeout bounds the wait for Running when ctx has no earlier deadline. Default: 5m.
	StartTimeout time.Duration
	// Logger receives sandbox lifecycle events, never command output. Default: discards.
	Logger *slog.Logger
}

// WithDefaults returns a copy with every unset field at its documented default.
func (c KubernetesConfig) WithDefaults() KubernetesConfig {
	if c.Namespace == "" {
		c.Namespace = "boxcar-sandboxes"
	}
	if c.ImagePullPolicy == "" {
		c.ImagePullPolicy = corev1.PullIfNotPresent
	}
	if c.WorkerID == "" {
		c.WorkerID = "boxcar"
	}
	if c.UID == 0 {
		c.UID = 1000
	}
	if c.GID == 0 {
		c.GID = 1000
	}
	if c.TmpSize == "" {
		c.TmpSize = "64Mi"
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = 5 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func (c KubernetesConfig) validate() error {
	var errs []error
	if c.Client == nil {
		errs = append(errs, errors.New("Client is required: build one with kubernetes.NewForConfig"))
	}
	if c.Executor == nil && c.RESTConfig == nil {
		errs = append(errs, errors.New("RESTConfig is required for pods/exec: use rest.InClusterConfig() or clientcmd.BuildConfigFromFlags(\"\", kubeconfig)"))
	}
	if c.UID < 1 || c.GID < 1 {
		errs = append(errs, fmt.Errorf("UID %d / GID %d: sandbox pods run as non-root; use ids above 0", c.UID, c.GID))
	}
	if q, err := resource.ParseQuantity(c.TmpSize); err != nil || q.Sign() <= 0 {
		errs = append(errs, fmt.Errorf("TmpSize %q is not a positive quantity such as 64Mi", c.TmpSize))
	}
	if validLabel(c.WorkerID) != c.WorkerID {
		errs = append(errs, fmt.Errorf("WorkerID %q must be a valid label value (letters, digits, -_. ; at most 63)", c.WorkerID))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sandbox: kubernetes: %w", err)
	}
	return nil
}

// KubernetesProvider starts one pod per sandbox.
type KubernetesProvider struct {
	cfg  KubernetesConfig
	exec PodExecutor
	log  *slog.Logger
}

// NewKubernetes checks the configuration. It does not contact the cluster.
func NewKubernetes(cfg KubernetesConfig) (*KubernetesProvider, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	p := &KubernetesProvider{cfg: cfg, exec: cfg.Executor, log: cfg.Logger}
	if p.exec == nil {
		core, err := corev1client.NewForConfig(rest.CopyConfig(cfg.RESTConfig))
		if err != nil {
			return nil, fmt.Errorf("sandbox: kubernetes: RESTConfig: %w", err)
		}
		p.exec = &streamExecutor{rest: core.RESTClient(), config: cfg.RESTConfig}
	}
	return p, nil
}

// Backend names the backend.
func (p *KubernetesProvider) Backend() string { return "kubernetes" }

// Start creates the pod and waits, through a watch, until it runs. Whatever goes wrong, the
// pod is deleted before Start returns an error.
func (p *KubernetesProvider) Start(ctx context.Context, spec Spec) (Sandbox, error) {
	spec.SandboxSpec = config.Profile{Sandbox: spec.SandboxSpec}.WithDefaults().Sandbox
	if spec.Image == "" {
		spec.Image = p.cfg.Image
	}
	pod, err := p.podFor(spec)
	if err != nil {
		return nil, err
	}
	pods := p.cfg.Client.CoreV1().Pods(p.cfg.Namespace)
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("sandbox: start pod for job %s in namespace %s: %w", spec.JobID, p.cfg.Namespace, err)
	}
	log := p.log.With("sandbox_id", created.Name, "job_id", spec.JobID)
	running, err := p.waitRunning(ctx, created.Name)
	if err != nil {
		p.deletePod(ctx, log, created.Name)
		return nil, fmt.Errorf("sandbox: start pod %s: %w", created.Name, err)
	}
	s := &kubernetesSandbox{
		p: p, name: created.Name, workdir: spec.Workdir, log: log,
		calls: newCalls(),
		info: Info{
			Backend: p.Backend(), ID: created.Name, Image: spec.Image,
			CPU: spec.CPU, Memory: spec.Memory, Disk: spec.Disk, PIDs: spec.PIDs,
			Isolation: isolationOf(created),
		},
	}
	for _, cs := range running.Status.ContainerStatuses {
		if cs.Name == containerName {
			s.info.ImageDigest = imageDigest(cs.ImageID)
		}
	}
	log.Info("sandbox started", "backend", p.Backend())
	return s, nil
}

// imageDigest takes the digest out of an image id such as docker.io/library/x@sha256:….
func imageDigest(imageID string) string {
	if i := strings.LastIndex(imageID, "@"); i >= 0 {
		return imageID[i+1:]
	}
	return imageID
}

func isolationOf(pod *corev1.Pod) string {
	var b strings.Builder
	b.WriteString("pod; pss=restricted; non-root; capabilities=none; seccomp=RuntimeDefault; root=read-only; service-account-token=none")
	if rc := pod.Spec.RuntimeClassName; rc != nil {
		fmt.Fprintf(&b, "; runtime_class=%s", *rc)
	}
	lim := pod.Spec.Containers[0].Resources.Limits
	fmt.Fprintf(&b, "; limits=cpu:%s,memory:%s,ephemeral-storage:%s", lim.Cpu(), lim.Memory(), lim.StorageEphemeral())
	fmt.Fprintf(&b, "; network=deny-all NetworkPolicy on %s=%s", LabelComponent, componentValue)
	if d := pod.Spec.ActiveDeadlineSeconds; d != nil {
		fmt.Fprintf(&b, "; active_deadline=%ds", *d)
	}
	return b.String()
}

// dnsUnsafe and labelUnsafe find what pod names and label values may not hold.
var (
	dnsUnsafe   = regexp.MustCompile(`[^a-z0-9-]+`)
	labelUnsafe = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)
)

func validLabel(s string) string {
	s = strings.Trim(labelUnsafe.ReplaceAllString(s, "-"), "-_.")
	if len(s) > 63 {
		s = strings.TrimRight(s[:63], "-_.")
	}
	return s
}

// podFor is the pod of one sandbox. It passes the "restricted" Pod Security Standard: non-root,
// no privilege escalation, no capabilities, RuntimeDefault seccomp, and a read-only root
// filesystem besides; no service-account token, no service links, no secrets, bounded
// resources, a size-limited workdir and /tmp, and a deadline.
func (p *KubernetesProvider) podFor(spec Spec) (*corev1.Pod, error) {
	if spec.Image == "" {
		return nil, errors.New("sandbox: start: the kubernetes backend needs an image: set the profile's sandbox.image (it must hold a POSIX sh)")
	}
	lim, err := parseLimits(spec.SandboxSpec)
	if err != nil {
		return nil, err
	}
	workdir := path.Clean(spec.Workdir)
	if !path.IsAbs(workdir) || workdir == "/" || workdir == "/tmp" || slices.ContainsFunc([]string{"/proc", "/dev", "/sys"}, func(r string) bool {
		return workdir == r || strings.HasPrefix(workdir, r+"/")
	}) {
		return nil, fmt.Errorf("sandbox: start: workdir %q must be an absolute path outside /proc, /dev and /sys and other than / and /tmp, such as /work", spec.Workdir)
	}
	tmpSize := resource.MustParse(p.cfg.TmpSize)
	diskSize := resource.MustParse(spec.Disk)
	resources := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse(spec.CPU),
		corev1.ResourceMemory:           resource.MustParse(spec.Memory),
		corev1.ResourceEphemeralStorage: *resource.NewQuantity(lim.disk+tmpSize.Value(), resource.BinarySI),
	}
	name := "boxcar-" + strings.Trim(dnsUnsafe.ReplaceAllString(strings.ToLower(spec.JobID), "-"), "-")
	if len(name) > 40 {
		name = strings.TrimRight(name[:40], "-")
	}
	name += "-" + randomHex(4)
	deadline := max(int64(time.Duration(spec.Lifetime).Seconds()), 1)
	yes, no := true, false
	var grace int64 = 1
	seccomp := &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Labels: map[string]string{
				LabelManagedBy: managedBy,
				LabelComponent: componentValue,
				LabelJobID:     validLabel(spec.JobID),
				LabelWorker:    p.cfg.WorkerID,
			},
			Annotations: map[string]string{annotationJob: spec.JobID},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			ActiveDeadlineSeconds:         &deadline,
			TerminationGracePeriodSeconds: &grace,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   &yes,
				RunAsUser:      &p.cfg.UID,
				RunAsGroup:     &p.cfg.GID,
				FSGroup:        &p.cfg.GID,
				SeccompProfile: seccomp,
			},
			Containers: []corev1.Container{{
				Name:            containerName,
				Image:           spec.Image,
				ImagePullPolicy: p.cfg.ImagePullPolicy,
				// The container only has to stay alive; commands arrive through pods/exec.
				Command:    []string{"sh", "-c", `trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done`},
				WorkingDir: workdir,
				Env: []corev1.EnvVar{
					{Name: "HOME", Value: workdir},
					{Name: "LANG", Value: "C.UTF-8"},
				},
				Resources: corev1.ResourceRequirements{Requests: resources, Limits: resources},
				SecurityContext: &corev1.SecurityContext{
					RunAsNonRoot:             &yes,
					AllowPrivilegeEscalation: &no,
					Privileged:               &no,
					ReadOnlyRootFilesystem:   &yes,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile:           seccomp,
				},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "workdir", MountPath: workdir},
					{Name: "tmp", MountPath: "/tmp"},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "workdir", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &diskSize}}},
				{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &tmpSize}}},
			},
		},
	}
	if spec.RuntimeClass != "" {
		pod.Spec.RuntimeClassName = &spec.RuntimeClass
	}
	return pod, nil
}

// failFast are the container waiting reasons that will not resolve by waiting.
var failFast = map[string]bool{
	"ErrImagePull": true, "ImagePullBackOff": true, "InvalidImageName": true, "ErrImageNeverPull": true,
	"CreateContainerConfigError": true, "CreateContainerError": true, "RunContainerError": true,
	"CrashLoopBackOff": true,
}

// podState says whether the pod runs, cannot run (err), or may still get there.
func podState(pod *corev1.Pod) (running bool, err error) {
	// The container says more than the pod: a pod whose container could not start is only
	// "Failed", with no reason of its own.
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && failFast[w.Reason] {
			return false, fmt.Errorf("container %s cannot start: %s: %s%s", cs.Name, w.Reason, w.Message, imageHint(w.Message))
		}
		if t := cs.State.Terminated; t != nil {
			return false, fmt.Errorf("container %s exited (%s, code %d): %s%s", cs.Name, t.Reason, t.ExitCode, t.Message, imageHint(t.Message))
		}
	}
	switch pod.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		return false, fmt.Errorf("pod ended (%s) before it was used: %s %s", pod.Status.Phase, pod.Status.Reason, pod.Status.Message)
	}
	if pod.DeletionTimestamp != nil {
		return false, errors.New("pod is being deleted")
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

// imageHint adds advice when the runtime could not find the container's program: the sandbox
// container runs sh.
func imageHint(msg string) string {
	if missingShell(msg) {
		return " (the sandbox container runs sh: use an image with a POSIX sh on its PATH)"
	}
	return ""
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

// waitRunning watches the pod until it runs, fails, or ctx (bounded by StartTimeout) ends. The
// watch opens before the pod is read, so no change falls between the two; a watch the server
// closes is reopened.
func (p *KubernetesProvider) waitRunning(ctx context.Context, name string) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	pods := p.cfg.Client.CoreV1().Pods(p.cfg.Namespace)
	selector := fields.OneTermEqualSelector("metadata.name", name).String()
	last := &corev1.Pod{}
	gaveUp := func(err error) error {
		return fmt.Errorf("not running after waiting (%s): %w", pending(last), err)
	}
	for {
		w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: selector})
		if err != nil {
			return nil, gaveUp(err)
		}
		pod, err := pods.Get(ctx, name, metav1.GetOptions{})
		for err == nil && pod != nil {
			last = pod
			var ok bool
			if ok, err = podState(pod); ok {
				w.Stop()
				return pod, nil
			}
			if err != nil {
				break
			}
			pod = nil // until an event brings news; none (a closed watch) means reopen
			select {
			case <-ctx.Done():
				err = gaveUp(ctx.Err())
			case ev, open := <-w.ResultChan():
				got, isPod := ev.Object.(*corev1.Pod)
				switch {
				case !open || ev.Type == watch.Error:
				case !isPod || got.Name != name:
					pod = last // another pod: keep waiting
				case ev.Type == watch.Deleted:
					err = errors.New("pod was deleted while starting")
				default:
					pod = got
				}
			}
		}
		w.Stop()
		if err != nil {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, gaveUp(ctx.Err())
		}
	}
}

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

// Reap deletes the sandbox pods in the namespace, whichever worker started them, whose job is
// no longer held: held(jobID, worker) reports whether the worker named on the pod still runs
// that job. Pods younger than minAge are spared, which covers a pod between its creation and
// its registration with its worker. It returns how many it deleted.
func (p *KubernetesProvider) Reap(ctx context.Context, held func(jobID, worker string) bool, minAge time.Duration) (int, error) {
	sel := labels.SelectorFromSet(labels.Set{LabelManagedBy: managedBy, LabelComponent: componentValue})
	list, err := p.cfg.Client.CoreV1().Pods(p.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return 0, fmt.Errorf("sandbox: reap: list pods in %s: %w", p.cfg.Namespace, err)
	}
	var n int
	var errs []error
	for _, pod := range list.Items {
		jobID, worker := pod.Annotations[annotationJob], pod.Labels[LabelWorker]
		if pod.DeletionTimestamp != nil || time.Since(pod.CreationTimestamp.Time) < minAge || held(jobID, worker) {
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
func (p *KubernetesProvider) RunReaper(ctx context.Context, interval time.Duration, held func(jobID, worker string) bool) error {
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

// kubernetesSandbox is one pod. Commands and file transfers run through exec, each wrapped in a
// small POSIX sh script, so the image needs sh and the usual busybox or coreutils tools (env,
// grep with -z, readlink -f, stat, find, cat, mv).
type kubernetesSandbox struct {
	p       *KubernetesProvider
	name    string
	workdir string
	info    Info
	log     *slog.Logger

	*calls

	closeMu sync.Mutex
	deleted bool
}

// Close stops running commands and deletes the pod. It is idempotent.
func (s *kubernetesSandbox) Close(ctx context.Context) error {
	s.shutdown(fmt.Errorf("sandbox %s: %w", s.name, ErrClosed))

	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.deleted {
		return nil
	}
	// Running commands are being killed inside the pod; deleting it ends them in any case,
	// so wait only briefly.
	select {
	case <-s.idle:
	case <-ctx.Done():
	case <-time.After(killGrace):
	}
	if err := s.p.deletePod(ctx, s.log, s.name); err != nil {
		return err
	}
	s.deleted = true
	s.log.Info("sandbox closed")
	return nil
}

// Info describes the sandbox.
func (s *kubernetesSandbox) Info() Info { return s.info }

// killGrace is how long a command may outlive its timeout before the worker kills it from
// outside, and how long that kill may take.
const killGrace = 10 * time.Second

// execScript runs a command inside the pod with what pods/exec lacks: an environment of the
// caller's choosing (env -i: nothing of the container's), a folder, stdin kept for the
// background job, and a timeout that kills the whole tree. Every process of the command
// carries BOXCAR_EXEC=<nonce> in its environment, which is how the tree is found: process
// groups are not reliable in a container without job control. When the command ends, what it
// left running is killed too, as in the bubblewrap backend.
//
// Arguments: timeout in seconds (0: none), nonce, folder, then NAME=VALUE... and argv.
const execScript = `t=$1 m=$2 d=$3
shift 3
cd -- "$d" 2>/dev/null || { echo "boxcar-$m: notfound" >&2; exit 125; }
` + killFunc + `
exec 3<&0
env -i "BOXCAR_EXEC=$m" "$@" 0<&3 3<&- &
c=$!
exec 3<&-
w=
if [ "$t" != 0 ]; then
	(sleep "$t"; k) </dev/null >/dev/null 2>&1 &
	w=$!
fi
wait "$c"
rc=$?
[ -n "$w" ] && kill "$w" 2>/dev/null
k
exit "$rc"
`

// killFunc kills every process whose environment holds BOXCAR_EXEC=$m, until none is left.
// grep reads each environment as NUL-separated records (-z, which GNU, busybox and toybox grep
// have): busybox grep without it stops reading a line at the first NUL, and so would find the
// variable only where it comes first, while a shell re-orders the environment of what it
// executes. The processes found are all stopped, then all killed: killed one by one, a parent
// could act on the death of its child (sleep 1; echo late) before its own turn came.
const killFunc = `k() {
	i=0
	while [ "$i" -lt 20 ]; do
		p=
		for f in $(grep -l -s -z -x -F "BOXCAR_EXEC=$m" /proc/[0-9]*/environ); do
			f=${f#/proc/}
			p="$p ${f%/environ}"
		done
		[ -z "$p" ] && return
		kill -STOP $p
		kill -9 $p
		i=$((i+1))
	done
} 2>/dev/null`

// killScript kills a command's tree from outside, when its stream could not be ended in time.
const killScript = `m=$1
` + killFunc + `
k`

// fileScript moves files through exec, confined to the workdir: every path is resolved inside
// the pod (symlinks included) and refused unless it stays beneath the workdir; no folder is made
// before the deepest existing one on the way is known to be inside, and a symlink where a file
// is written is replaced, not written through (mv would move the file into a folder it names).
// It reports failures as "boxcar-<nonce>: <reason>" on stderr with exit code 125.
//
// Arguments: operation (read, write, list), nonce, workdir, workdir-relative path, [max bytes].
const fileScript = `op=$1 m=$2 w=$3 f=$4
fail() { echo "boxcar-$m: $1" >&2; exit 125; }
W=$(cd -- "$w" 2>/dev/null && pwd -P) || fail notfound
p=$W/$f
inside() { case "$1/" in "$W"/*) return 0;; esac; return 1; }
case $op in
read)
	[ -e "$p" ] || [ -L "$p" ] || fail notfound
	r=$(readlink -f -- "$p" 2>/dev/null) || fail escape
	inside "$r" || fail escape
	[ -e "$r" ] || fail notfound
	[ -d "$r" ] && fail isdir
	[ -f "$r" ] || fail notregular
	s=$(wc -c < "$r") || fail notfound
	[ "$s" -le "$5" ] || fail toolarge
	exec cat -- "$r";;
write)
	d=$(dirname -- "$p")
	a=$d
	while [ ! -e "$a" ] && [ ! -L "$a" ]; do a=$(dirname -- "$a"); done
	ra=$(readlink -f -- "$a" 2>/dev/null) || fail escape
	inside "$ra" || fail escape
	mkdir -p -- "$d" 2>/dev/null
	rd=$(cd -- "$d" 2>/dev/null && pwd -P) || fail notfound
	inside "$rd" || fail escape
	b=$(basename -- "$p")
	[ -d "$rd/$b" ] && [ ! -L "$rd/$b" ] && fail isdir
	tmp=$rd/.boxcar-write-$m
	cat > "$tmp" || { rm -f -- "$tmp"; fail ioerror; }
	[ -L "$rd/$b" ] && rm -f -- "$rd/$b"
	mv -f -- "$tmp" "$rd/$b" || { rm -f -- "$tmp"; fail ioerror; };;
list)
	[ -e "$p" ] || [ -L "$p" ] || fail notfound
	r=$(readlink -f -- "$p" 2>/dev/null) || fail escape
	inside "$r" || fail escape
	[ -e "$r" ] || fail notfound
	[ -d "$r" ] || fail notdir
	r=$(cd -- "$r" && pwd -P) || fail notfound
	inside "$r" || fail escape
	printf '%s\0' "$r"
	find "$r/" -type f -exec sh -c 'for x do printf "%s %s\0%s\0" "$(stat -c %s -- "$x")" "$(stat -c %a -- "$x")" "$x"; done' sh {} +;;
esac
`

// run executes a script in the pod and returns its exit code.
func (s *kubernetesSandbox) run(ctx context.Context, argv []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	err := s.p.exec.Exec(ctx, s.p.cfg.Namespace, s.name, argv, stdin, stdout, stderr)
	var exit utilexec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exit) && exit.Exited():
		return exit.ExitStatus(), nil
	}
	return -1, err
}

// Exec runs argv in the pod through the exec wrapper.
func (s *kubernetesSandbox) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	dir, maxOut, err := checkExec(req)
	if err != nil {
		return ExecResult{}, err
	}
	name := req.Argv[0]
	if strings.Contains(name, "=") {
		// env would take it for a variable.
		return ExecResult{}, fmt.Errorf("sandbox: exec %s: a program name must not contain '='", name)
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	id, err := s.begin(cancel)
	if err != nil {
		return ExecResult{}, fmt.Errorf("sandbox: exec %s: %w", name, err)
	}
	defer s.end(id)

	nonce := randomHex(8)
	env := map[string]string{"PATH": defaultPATH, "HOME": s.workdir, "LANG": "C.UTF-8"}
	maps.Copy(env, req.Env)
	argv := []string{"sh", "-c", execScript, "boxcar-exec", seconds(req.Timeout), nonce, path.Join(s.workdir, dir)}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		argv = append(argv, k+"="+env[k])
	}
	argv = append(argv, req.Argv...)

	streamCtx := runCtx
	if req.Timeout > 0 {
		var stop context.CancelFunc
		streamCtx, stop = context.WithTimeoutCause(runCtx, req.Timeout+killGrace, errExecTimeout)
		defer stop()
	}
	stdout := &cappedBuffer{max: maxOut}
	stderr := &cappedBuffer{max: maxOut}
	// Always a stdin, empty when none is given: the wrapper hands it on to the command.
	stdin := bytes.NewReader(req.Stdin)
	start := time.Now()
	code, err := s.run(streamCtx, argv, stdin, stdout, stderr)
	res := ExecResult{ExitCode: code, Duration: time.Since(start)}
	res.Stdout, res.StdoutTruncated = stdout.take()
	res.Stderr, res.StderrTruncated = stderr.take()
	if streamCtx.Err() != nil {
		// Closing the stream does not stop the command: kill its tree inside the pod.
		s.kill(ctx, nonce)
		switch cause := context.Cause(streamCtx); {
		case errors.Is(cause, errExecTimeout):
			res.ExitCode, res.TimedOut = 137, true
			return res, nil
		default:
			return res, stopError(ctx, name, cause)
		}
	}
	if err != nil {
		return ExecResult{}, s.execFailure("exec "+name, err)
	}
	if code == 125 && bytes.HasPrefix(res.Stderr, []byte("boxcar-"+nonce+": notfound")) {
		return ExecResult{}, fmt.Errorf("sandbox: exec %s: dir %s: %w", name, dir, ErrNotFound)
	}
	if req.Timeout > 0 && code == 137 && res.Duration >= req.Timeout {
		res.TimedOut = true
	}
	return res, nil
}

// execFailure explains an exec that ended without an exit code. A runtime that cannot start
// the program it was asked to exec answers with an internal-error status, not exit code 126 or
// 127 (docs/test-cluster.md, pitfall 8). The backend always execs sh, which starts the command
// itself (a command that is missing is sh's exit code 127, a result), so this means the image
// has no usable sh.
func (s *kubernetesSandbox) execFailure(op string, err error) error {
	if msg := err.Error(); strings.Contains(strings.ToLower(msg), "internal error") && missingShell(msg) {
		return fmt.Errorf("sandbox: %s in pod %s: the container runtime could not start sh, which runs every command and file transfer; use an image with a POSIX sh on its PATH (busybox or a distribution base): %w: %w",
			op, s.name, ErrUnavailable, err)
	}
	return fmt.Errorf("sandbox: %s in pod %s: %w", op, s.name, err)
}

// missingShell recognises the runtimes' words for a program that is not in the image.
func missingShell(msg string) bool {
	msg = strings.ToLower(msg)
	return strings.Contains(msg, "executable file not found") || strings.Contains(msg, "no such file or directory")
}

// seconds formats a timeout for sleep(1), which busybox and coreutils take fractional.
func seconds(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 3, 64)
}

func (s *kubernetesSandbox) kill(ctx context.Context, nonce string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killGrace)
	defer cancel()
	if _, err := s.run(ctx, []string{"sh", "-c", killScript, "boxcar-kill", nonce}, nil, io.Discard, io.Discard); err != nil {
		s.log.Warn("kill a command in the pod", "error", err)
	}
}

// file runs fileScript; a failure the script reports becomes the matching sentinel.
func (s *kubernetesSandbox) file(ctx context.Context, op, name string, stdin io.Reader, stdout io.Writer, extra ...string) error {
	id, err := s.begin(nil)
	if err != nil {
		return fmt.Errorf("sandbox: %s %s: %w", op, name, err)
	}
	defer s.end(id)
	nonce := randomHex(8)
	stderr := &cappedBuffer{max: 4096}
	argv := append([]string{"sh", "-c", fileScript, "boxcar-file", op, nonce, s.workdir, name}, extra...)
	code, err := s.run(ctx, argv, stdin, stdout, stderr)
	switch {
	case err != nil:
		return s.execFailure(op+" "+name, err)
	case code == 0:
		return nil
	}
	errOut, _ := stderr.take()
	reason, ok := bytes.CutPrefix(bytes.TrimSpace(errOut), []byte("boxcar-"+nonce+": "))
	if code != 125 || !ok {
		return fmt.Errorf("sandbox: %s %s: exit %d: %s", op, name, code, firstLine(errOut, nil))
	}
	switch string(reason) {
	case "notfound":
		return fmt.Errorf("sandbox: %s %s: %w", op, name, ErrNotFound)
	case "escape":
		return fmt.Errorf("sandbox: %s %s: a symlink leads out of the workdir: %w", op, name, ErrPathEscape)
	case "toolarge":
		return fmt.Errorf("sandbox: %s %s: more than the %s bytes allowed: %w", op, name, extra[0], ErrTooLarge)
	case "isdir":
		return fmt.Errorf("sandbox: %s %s: is a folder, not a file", op, name)
	case "notdir":
		return fmt.Errorf("sandbox: %s %s: read a file with ReadFile: %w", op, name, ErrNotDir)
	case "notregular":
		return fmt.Errorf("sandbox: %s %s: is not a regular file", op, name)
	}
	return fmt.Errorf("sandbox: %s %s: %s", op, name, reason)
}

// WriteFile creates or replaces a regular file in the workdir, creating parent folders.
func (s *kubernetesSandbox) WriteFile(ctx context.Context, name string, data []byte) error {
	clean, err := CleanPath(name)
	if err != nil {
		return fmt.Errorf("sandbox: write: %w", err)
	}
	if clean == "." {
		return fmt.Errorf("sandbox: write %q: names the workdir itself; name a file: %w", name, ErrPathEscape)
	}
	return s.file(ctx, "write", clean, bytes.NewReader(data), io.Discard)
}

// ReadFile reads a regular file of at most maxBytes from the workdir.
func (s *kubernetesSandbox) ReadFile(ctx context.Context, name string, maxBytes int64) ([]byte, error) {
	clean, err := CleanPath(name)
	if err != nil {
		return nil, fmt.Errorf("sandbox: read: %w", err)
	}
	// One byte past the cap shows a file that grew after the pod measured it.
	out := &cappedBuffer{max: int(max(min(maxBytes, 1<<31-2)+1, 0))}
	if err := s.file(ctx, "read", clean, nil, out, strconv.FormatInt(maxBytes, 10)); err != nil {
		return nil, err
	}
	data, truncated := out.take()
	if int64(len(data)) > maxBytes || truncated {
		return nil, fmt.Errorf("sandbox: read %s: more than the %d bytes allowed: %w", clean, maxBytes, ErrTooLarge)
	}
	if data == nil {
		return []byte{}, nil
	}
	return data, nil
}

// maxListing bounds the answer of a List from a pod: a workdir of millions of files must not
// exhaust the worker's memory.
const maxListing = 64 << 20

// List returns the regular files under dir, recursively, without following symlinks.
func (s *kubernetesSandbox) List(ctx context.Context, dir string) ([]FileInfo, error) {
	clean, err := CleanPath(dir)
	if err != nil {
		return nil, fmt.Errorf("sandbox: list: %w", err)
	}
	out := &cappedBuffer{max: maxListing}
	if err := s.file(ctx, "list", clean, nil, out); err != nil {
		return nil, err
	}
	listing, truncated := out.take()
	if truncated {
		return nil, fmt.Errorf("sandbox: list %s: the listing is over %d bytes; list a subfolder: %w", clean, maxListing, ErrTooLarge)
	}
	// Records: the resolved folder, then "size mode", path pairs; all NUL-terminated.
	fields := strings.Split(string(listing), "\x00")
	if len(fields) < 2 {
		return nil, fmt.Errorf("sandbox: list %s: unexpected answer from the pod", clean)
	}
	base, fields := fields[0], fields[1:len(fields)-1]
	var files []FileInfo
	for i := 0; i+1 < len(fields); i += 2 {
		var size int64
		var mode uint32
		if _, err := fmt.Sscanf(fields[i], "%d %o", &size, &mode); err != nil {
			return nil, fmt.Errorf("sandbox: list %s: unexpected record %q", clean, fields[i])
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(fields[i+1], base), "/")
		files = append(files, FileInfo{Path: path.Join(clean, rel), Size: size, Mode: fs.FileMode(mode & 0o777)})
	}
	slices.SortFunc(files, func(a, b FileInfo) int { return strings.Compare(a.Path, b.Path) })
	return files, nil
}

// streamExecutor runs commands through the pods/exec subresource: WebSocket
// (v5.channel.k8s.io, which can close stdin) first, SPDY when the server cannot upgrade to it
// (API servers before 1.30, some proxies). Falling back on any other error would run a
// command twice.
type streamExecutor struct {
	rest   rest.Interface // builds the exec URL
	config *rest.Config   // dials it
}

// shouldFallBack is docs/test-cluster.md pitfall 9. The types are k8s.io/streaming's: client-go's
// WebSocket executor returns its UpgradeFailureError, which the deprecated copy in
// k8s.io/apimachinery/pkg/util/httpstream does not match.
func shouldFallBack(err error) bool {
	return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
}

func (e *streamExecutor) Exec(ctx context.Context, namespace, pod string, argv []string, stdin io.Reader, stdout, stderr io.Writer) error {
	req := e.rest.Post().Resource("pods").Namespace(namespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: containerName, Command: argv,
			Stdin: stdin != nil, Stdout: true, Stderr: true,
		}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(e.config, "GET", req.URL().String())
	if err != nil {
		return fmt.Errorf("websocket executor: %w", err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(e.config, "POST", req.URL())
	if err != nil {
		return fmt.Errorf("spdy executor: %w", err)
	}
	exec, err := remotecommand.NewFallbackExecutor(ws, spdy, shouldFallBack)
	if err != nil {
		return err
	}
	return exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Stderr: stderr})
}
