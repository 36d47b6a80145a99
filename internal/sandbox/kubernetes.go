package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

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
	// LabelInstance names the deployment of workers that started the pod (Instance); absent
	// when Instance is empty.
	LabelInstance = "boxcar.run/instance"
	// LabelTenant names the tenant of the pod's job, made label-safe; the annotation holds it
	// whole. A warm pod gets it at its claim, with its job; absent on pods of workers older
	// than the label (or, for a warm pod, than its claim's).
	LabelTenant = "boxcar.run/tenant"

	managedBy        = "boxcar"
	componentValue   = "sandbox"
	annotationJob    = "boxcar.run/job-id"
	annotationTenant = "boxcar.run/tenant"
	containerName    = "sandbox"
)

// PodExecutor runs one command in a pod's container and streams its input and output. A
// non-zero exit comes back as an error implementing k8s.io/client-go/util/exec.ExitError.
// The default goes through the pods/exec subresource; tests substitute their own.
type PodExecutor interface {
	Exec(ctx context.Context, namespace, pod string, argv []string, stdin io.Reader, stdout, stderr io.Writer) error
}

// KubernetesConfig configures the pod backend.
type KubernetesConfig struct {
	// Client talks to the API server. Required. Build it from RefuseRedirects(RESTConfig): a
	// client of client-go's own follows an API server's redirect with the bearer token.
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
	// Instance labels the pods this worker starts (LabelInstance) and scopes Reap to pods with
	// the same label: every worker of one deployment shares it, and deployments that share a
	// namespace each have their own, so none reaps another's pods (their jobs are held in
	// another queue, which this worker cannot see). Empty (the default): no label, and Reap
	// takes only pods without one.
	Instance string
	// Owner names a ConfigMap in Namespace that owns every pod this worker starts (an
	// ownerReference): deleting it has the garbage collector delete them all, which needs no
	// worker. The Helm chart sets its own, deleted at `helm uninstall`. Empty (the default):
	// pods have no owner.
	Owner string
	// UID and GID the container runs as. Default: 1000. Never 0: pods run as non-root.
	UID, GID int64
	// TmpSize bounds the container's /tmp (an emptyDir; the root filesystem is read-only).
	// Default: 64Mi.
	TmpSize string
	// BridgeImage is an image holding the worker's static binary at BridgeBinary (the
	// worker's own image): an init container of every sandbox pod copies it into a volume,
	// from which AttachEgress runs the egress tunnel (package tunnel). Empty: pods get no
	// init container, and AttachEgress fails with ErrNoEgress.
	BridgeImage string
	// BridgeBinary is the worker binary's path in BridgeImage. Default: /usr/local/bin/worker.
	BridgeBinary string
	// ImagePullSecrets name Secrets in Namespace that every sandbox pod pulls its images with
	// (its own and BridgeImage): a pod reads its pull secrets from its own namespace, never
	// from the worker's. Default: none.
	ImagePullSecrets []string
	// NetworkPolicy says what isolates Namespace's network, for Info.Isolation: "deny-all"
	// (the default; the Helm chart's policy) or "none". See config.Kubernetes.NetworkPolicy.
	NetworkPolicy string
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
	if c.BridgeBinary == "" {
		c.BridgeBinary = "/usr/local/bin/worker"
	}
	if c.NetworkPolicy == "" {
		c.NetworkPolicy = config.NetworkPolicyDenyAll
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
		errs = append(errs, errors.New("the client is required: build one with kubernetes.NewForConfig"))
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
	if validLabel(c.Instance) != c.Instance {
		//nolint:staticcheck // ST1005: Instance is the field's name, as WorkerID and TmpSize above
		errs = append(errs, fmt.Errorf("Instance %q must be a valid label value (letters, digits, -_. ; at most 63): set sandbox.kubernetes.instance to one", c.Instance))
	}
	if _, ok := podNetworkIsolation[c.NetworkPolicy]; !ok {
		errs = append(errs, fmt.Errorf("NetworkPolicy %q is neither %s nor %s", c.NetworkPolicy, config.NetworkPolicyDenyAll, config.NetworkPolicyNone))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sandbox: kubernetes: %w", err)
	}
	return nil
}

// KubernetesConfigFor is the KubernetesConfig of the worker config's sandbox.kubernetes; the
// caller adds what the config does not hold: the client, RESTConfig, WorkerID and Logger.
func KubernetesConfigFor(k config.Kubernetes) KubernetesConfig {
	return KubernetesConfig{
		Namespace:        k.Namespace,
		ImagePullPolicy:  corev1.PullPolicy(k.ImagePullPolicy),
		Instance:         k.Instance,
		Owner:            k.Owner,
		BridgeImage:      k.BridgeImage,
		ImagePullSecrets: k.ImagePullSecrets,
		NetworkPolicy:    k.NetworkPolicy,
	}
}

// KubernetesProvider starts one pod per sandbox.
type KubernetesProvider struct {
	cfg  KubernetesConfig
	exec PodExecutor
	log  *slog.Logger
	run  string // this provider's own, on its pool pods (kubernetes_pool.go)
	// poolPods are the pool pods this provider's sandboxes hold, started and not closed.
	poolPods podSet

	ownerMu sync.Mutex
	owner   *metav1.OwnerReference // Owner's, once looked up (kubernetes_owner.go)

	// gone is the error of the last start when it found the namespace being deleted or gone
	// (unavailableAnswers' gone rows), else nil; Check reports it.
	gone atomic.Pointer[error]
}

// NewKubernetes checks the configuration. It does not contact the cluster.
func NewKubernetes(cfg KubernetesConfig) (*KubernetesProvider, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	p := &KubernetesProvider{cfg: cfg, exec: cfg.Executor, log: cfg.Logger, run: randomHex(8), poolPods: podSet{names: map[string]bool{}}}
	if p.exec == nil {
		rc := RefuseRedirects(cfg.RESTConfig)
		core, err := corev1client.NewForConfig(rc)
		if err != nil {
			return nil, fmt.Errorf("sandbox: kubernetes: RESTConfig: %w", err)
		}
		p.exec = &streamExecutor{rest: core.RESTClient(), config: rc}
	}
	return p, nil
}

// Backend names the backend.
func (p *KubernetesProvider) Backend() string { return "kubernetes" }

// Start creates the pod and waits, through a watch, until it runs. Whatever goes wrong, the
// pod is deleted before Start returns an error. A cluster that cannot take a sandbox now (its
// API server down, overloaded or refusing the worker, the namespace's quota full, no node for
// the pod) is ErrUnavailable (unavailableAnswers). A pod the garbage collector deleted because
// its owner had been made again is started once more, owned by the new one.
func (p *KubernetesProvider) Start(ctx context.Context, spec Spec) (Sandbox, error) {
	sb, err := p.start(ctx, spec)
	if errors.Is(err, errOwnerReplaced) {
		p.log.Warn("the sandbox pod went with its replaced owner; starting it again", "job_id", spec.JobID, "tenant", spec.Tenant, "error", err)
		sb, err = p.start(ctx, spec)
	}
	return sb, err
}

// start is one attempt of Start.
func (p *KubernetesProvider) start(ctx context.Context, spec Spec) (Sandbox, error) {
	if err := spec.Complete(); err != nil {
		return nil, fmt.Errorf("sandbox: start: %w", err)
	}
	if spec.Image == "" {
		spec.Image = p.cfg.Image
	}
	pod, err := p.podFor(spec)
	if err != nil {
		return nil, err
	}
	if spec.Pool == "" {
		sb, err := p.startPod(ctx, spec, pod)
		return sb, p.unavailable(ctx, spec, err)
	}
	// A pool pod is its sandbox's from before its create until its Close: the reaper keeps no
	// other unclaimed one of this worker run (unclaimedPoolPod).
	p.poolPods.add(pod.Name)
	sb, err := p.startPod(ctx, spec, pod)
	if err != nil {
		p.poolPods.remove(pod.Name)
	}
	return sb, p.unavailable(ctx, spec, err)
}

// startPod creates the pod and waits until it runs; see Start.
func (p *KubernetesProvider) startPod(ctx context.Context, spec Spec, pod *corev1.Pod) (Sandbox, error) {
	owner, err := p.ownerRef(ctx)
	if err != nil {
		return nil, err
	}
	if owner != nil {
		pod.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	log := p.log.With("sandbox_id", pod.Name, "job_id", spec.JobID, "tenant", spec.Tenant)
	if spec.Pool != "" {
		log = p.log.With("sandbox_id", pod.Name, "pool", spec.Pool)
	}
	pods := p.cfg.Client.CoreV1().Pods(p.cfg.Namespace)
	begin := time.Now()
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		if createMayHaveHappened(ctx, err) {
			_ = p.deletePod(ctx, log, pod.Name) // logged there
		}
		return nil, fmt.Errorf("sandbox: start pod for job %s in namespace %s: %w", spec.JobID, p.cfg.Namespace, err)
	}
	running, err := p.waitRunning(ctx, created.Name)
	if err != nil {
		_ = p.deletePod(ctx, log, created.Name) // logged there; the wait error is the one to report
		return nil, fmt.Errorf("sandbox: start pod %s: %w", created.Name, p.ownerReplaced(ctx, owner, err))
	}
	s := &kubernetesSandbox{
		p: p, name: created.Name, workdir: spec.Workdir, log: log,
		calls: newCalls(), created: begin, lifetime: time.Duration(spec.Lifetime), pod: created,
		info: Info{
			Backend: p.Backend(), ID: created.Name, Image: spec.Image,
			CPU: spec.CPU, Memory: spec.Memory, Disk: spec.Disk, // no PIDs: see isolationOf
			Isolation: p.isolationOf(created),
		},
	}
	for _, cs := range running.Status.ContainerStatuses {
		if cs.Name == containerName {
			s.info.ImageDigest = imageDigest(cs.ImageID)
		}
	}
	if spec.Pool != "" && p.cfg.BridgeImage != "" {
		if err := s.openCommands(ctx); err != nil {
			log.Warn("the warm pod's command session did not start; its commands go through pods/exec", "error", err)
		}
	}
	log.Info("sandbox started", "backend", p.Backend())
	return s, nil
}

// createMayHaveHappened reports whether a failed create may still have made its object: the
// API server refused it outright only when it answered with a status other than a timeout.
// Otherwise (ctx ended meanwhile, as when a worker stops; the connection broke) the object
// may exist under the name asked for, and the caller deletes it.
func createMayHaveHappened(ctx context.Context, err error) bool {
	var status apierrors.APIStatus
	return ctx.Err() != nil || !errors.As(err, &status) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err)
}
