// Command keda-standin scales a ScaledObject's Deployment on the test cluster with KEDA's own
// code, standing in for the two parts a KEDA install adds that the test cluster lacks: the
// operator's process and the HPA that reads KEDA's metrics API.
//
// What is KEDA's (github.com/kedacore/keda/v2 at the version go.mod names): the ScaledObject
// type it reads from the API server; the nats-jetstream scaler, built with
// scalers.NewNATSJetStreamScaler from the ScaledObject's trigger metadata, whose
// GetMetricsAndActivity reads the consumer's lag from NATS monitoring; fallback.
// GetMetricsWithFallback, which counts failed reads in the ScaledObject's status and, past
// fallback.failureThreshold, answers fallback.replicas × the target instead; and the scale
// executor's RequestScale, which activates the Deployment from zero, records the last active
// time and, after cooldownPeriod, scales it back to minReplicaCount. What stands in: the loop
// that calls them every pollingInterval (the operator's scale loop, reduced to one trigger),
// and the HPA (hpa.go), which every --hpa-sync-period computes the replicas the HPA controller
// would from the same metric and sets them on the Deployment's scale subresource.
//
// One field of the trigger metadata is replaced: natsServerMonitoringEndpoint names a cluster
// DNS name that only pods resolve, and this runs on the host, so --endpoint gives the address
// of a port-forward to it. It prints one line per step on stdout.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	"github.com/kedacore/keda/v2/pkg/fallback"
	"github.com/kedacore/keda/v2/pkg/scalers"
	"github.com/kedacore/keda/v2/pkg/scalers/scalersconfig"
	"github.com/kedacore/keda/v2/pkg/scaling/executor"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/scale"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"k8s.io/metrics/pkg/apis/external_metrics"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

func main() {
	// A flag set of its own: controller-runtime registers a global --kubeconfig of its own.
	fs := flag.NewFlagSet("keda-standin", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster")
	namespace := fs.String("namespace", "boxcar", "namespace of the ScaledObject")
	name := fs.String("scaledobject", "boxcar", "name of the ScaledObject")
	endpoint := fs.String("endpoint", "", "host:port that replaces the trigger's natsServerMonitoringEndpoint (a port-forward to it)")
	hpaPeriod := fs.Duration("hpa-sync-period", 15*time.Second, "how often the stand-in HPA reconciles (kube-controller-manager's --horizontal-pod-autoscaler-sync-period)")
	httpTimeout := fs.Duration("http-timeout", 3*time.Second, "the scaler's HTTP timeout (KEDA_HTTP_DEFAULT_TIMEOUT's default)")
	_ = fs.Parse(os.Args[1:])
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr)))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, *kubeconfig, *namespace, *name, *endpoint, *hpaPeriod, *httpTimeout); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "keda-standin:", err)
		os.Exit(1)
	}
}

type standin struct {
	c           client.Client
	scales      scale.ScalesGetter
	exec        executor.ScaleExecutor
	ns, name    string
	target      string // the Deployment, the ScaledObject's scaleTargetRef
	endpoint    string
	httpTimeout time.Duration
	gvkr        kedav1alpha1.GroupVersionKindResource
	start       time.Time

	// What the operator's scalers cache holds for the one trigger: the scaler, its config and
	// its metric spec (a metric named s<index>-nats-jetstream-<stream>, target AverageValue
	// lagThreshold). The lock is the cache's ScaledObjectUpdateLock, for the fallback's status.
	mu      sync.RWMutex
	scaler  scalers.Scaler
	config  *scalersconfig.ScalerConfig
	spec    autoscalingv2.MetricSpec
	updates sync.RWMutex
}

func run(ctx context.Context, kubeconfig, ns, name, endpoint string, hpaPeriod, httpTimeout time.Duration) error {
	if endpoint == "" {
		return errors.New("--endpoint is required: the host cannot resolve the cluster's DNS names")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.UserAgent = "keda-standin"
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := kedav1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	scales, err := scale.NewForConfig(cfg, mapper, dynamic.LegacyAPIPathResolverFunc, scale.NewDiscoveryScaleKindResolver(dc))
	if err != nil {
		return err
	}
	recorder, err := eventRecorder(ctx, cfg, scheme)
	if err != nil {
		return err
	}

	s := &standin{
		c: c, scales: scales, ns: ns, name: name, endpoint: endpoint, httpTimeout: httpTimeout,
		exec:  executor.NewScaleExecutor(c, scales, scheme, 5*time.Second, recorder),
		start: time.Now(),
	}
	so, err := s.get(ctx)
	if err != nil {
		return err
	}
	if so.Spec.ScaleTargetRef == nil {
		return fmt.Errorf("ScaledObject %s/%s has no scaleTargetRef", ns, name)
	}
	s.target = so.Spec.ScaleTargetRef.Name
	s.gvkr, err = kedav1alpha1.ParseGVKR(mapper, so.Spec.ScaleTargetRef.APIVersion, so.Spec.ScaleTargetRef.Kind)
	if err != nil {
		return err
	}
	if err := s.build(ctx, so); err != nil {
		return err
	}
	if err := s.initStatus(ctx); err != nil {
		return err
	}
	h := newHPA(behavior(so), *so.GetHPAMinReplicas(), so.GetHPAMaxReplicas())
	duck, err := kedav1alpha1.AsDuckWithTriggers(so)
	if err != nil {
		return err
	}
	poll := duck.GetPollingInterval()
	fb := "off"
	if so.Spec.Fallback != nil {
		fb = fmt.Sprintf("%d replicas after %d failed polls", so.Spec.Fallback.Replicas, so.Spec.Fallback.FailureThreshold)
	}
	fmt.Printf("keda-standin: ScaledObject %s/%s → %s %s: pollingInterval %s, cooldownPeriod %ds, replicas %d–%d (HPA %d–%d), scale-down stabilization %ds, fallback %s, metric %s target %s; HPA sync every %s\n",
		ns, name, s.gvkr.GVKString(), so.Spec.ScaleTargetRef.Name, poll, ptrOr(so.Spec.CooldownPeriod, 300),
		ptrOr(so.Spec.MinReplicaCount, 0), so.GetHPAMaxReplicas(), *so.GetHPAMinReplicas(), so.GetHPAMaxReplicas(),
		*h.behavior.ScaleDown.StabilizationWindowSeconds, fb, s.spec.External.Metric.Name, s.spec.External.Target.AverageValue, hpaPeriod)

	s.operatorStep(ctx)
	kedaTick, hpaTick := time.NewTicker(poll), time.NewTicker(hpaPeriod)
	defer kedaTick.Stop()
	defer hpaTick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-kedaTick.C:
			s.operatorStep(ctx)
		case <-hpaTick.C:
			s.hpaStep(ctx, h)
		}
	}
}

// eventRecorder records the executor's events (KEDAScaleTargetActivated, …) on the
// ScaledObject as the operator does, so `kubectl describe scaledobject` shows them.
func eventRecorder(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme) (events.EventRecorder, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	b.StartRecordingToSink(ctx.Done())
	return b.NewRecorder(scheme, "keda-operator"), nil
}

func (s *standin) get(ctx context.Context) (*kedav1alpha1.ScaledObject, error) {
	so := &kedav1alpha1.ScaledObject{}
	err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: s.name}, so)
	return so, err
}

// build makes the scaler as the operator's scalers_builder does for a nats-jetstream trigger,
// from the live ScaledObject, with the one field replaced.
func (s *standin) build(ctx context.Context, so *kedav1alpha1.ScaledObject) error {
	index := -1
	for i, t := range so.Spec.Triggers {
		if t.Type == "nats-jetstream" {
			index = i
			break
		}
	}
	if index < 0 {
		return fmt.Errorf("ScaledObject %s/%s has no nats-jetstream trigger", s.ns, s.name)
	}
	t := so.Spec.Triggers[index]
	metadata := maps.Clone(t.Metadata)
	if s.config == nil {
		fmt.Printf("keda-standin: trigger %d (nats-jetstream) metadata %v; natsServerMonitoringEndpoint %q replaced by %q, a port-forward to it\n",
			index, t.Metadata, metadata["natsServerMonitoringEndpoint"], s.endpoint)
	}
	metadata["natsServerMonitoringEndpoint"] = s.endpoint
	config := &scalersconfig.ScalerConfig{
		ScalableObjectName:      so.Name,
		ScalableObjectNamespace: so.Namespace,
		ScalableObjectType:      "ScaledObject",
		TriggerName:             t.Name,
		TriggerMetadata:         metadata,
		TriggerType:             t.Type,
		TriggerUseCachedMetrics: t.UseCachedMetrics,
		ResolvedEnv:             map[string]string{},
		AuthParams:              map[string]string{},
		GlobalHTTPTimeout:       s.httpTimeout,
		TriggerIndex:            index,
		MetricType:              t.MetricType,
		ScaledObject:            so,
		TriggerUniqueKey:        fmt.Sprintf("ScaledObject-%s-%s-%d", so.Namespace, so.Name, index),
	}
	scaler, err := scalers.NewNATSJetStreamScaler(config)
	if err != nil {
		return fmt.Errorf("KEDA refuses the trigger's metadata: %w", err)
	}
	specs := scaler.GetMetricSpecForScaling(ctx)
	if len(specs) != 1 || specs[0].External == nil || specs[0].External.Target.AverageValue == nil {
		return fmt.Errorf("the scaler's metric spec is %+v, want one External AverageValue metric", specs)
	}
	s.mu.Lock()
	old := s.scaler
	s.scaler, s.config, s.spec = scaler, config, specs[0]
	s.mu.Unlock()
	if old != nil {
		_ = old.Close(ctx)
	}
	return nil
}

// initStatus writes what the operator's ScaledObject controller writes when it takes the object
// on: the target's kind and resource, the trigger's metric name and the initial conditions.
// It creates no HPA, so hpaName stays empty.
func (s *standin) initStatus(ctx context.Context) error {
	return s.patchStatus(ctx, func(so *kedav1alpha1.ScaledObject) {
		so.Status.ScaleTargetKind = s.gvkr.GVKString()
		so.Status.ScaleTargetGVKR = &s.gvkr
		so.Status.ExternalMetricNames = []string{s.spec.External.Metric.Name}
		if so.Status.Conditions == nil {
			so.Status.Conditions = *kedav1alpha1.GetInitializedConditions()
		}
		so.Status.Conditions.SetReadyCondition(metav1.ConditionTrue, kedav1alpha1.ScaledObjectConditionReadySuccessReason, kedav1alpha1.ScaledObjectConditionReadySuccessMessage)
	})
}

func (s *standin) patchStatus(ctx context.Context, change func(*kedav1alpha1.ScaledObject)) error {
	s.updates.Lock()
	defer s.updates.Unlock()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		so, err := s.get(ctx)
		if err != nil {
			return err
		}
		orig := so.DeepCopy()
		change(so)
		return s.c.Status().Patch(ctx, so, client.MergeFrom(orig))
	})
}

// observe is the operator's observeMetric: the scaler's GetMetricsAndActivity, then KEDA's
// fallback on its result, which updates the ScaledObject's health status.
func (s *standin) observe(ctx context.Context, so *kedav1alpha1.ScaledObject) (raw, metrics []external_metrics.ExternalMetricValue, active, fallbackActive bool, rawErr, err error) {
	s.mu.RLock()
	scaler, spec := s.scaler, s.spec
	s.mu.RUnlock()
	name := spec.External.Metric.Name
	raw, active, rawErr = scaler.GetMetricsAndActivity(ctx, name)
	soh := fallback.ScaledObjectHandler{Ctx: ctx, KubeClient: s.c, ScaleClient: s.scales, UpdateLock: &s.updates, ScaledObject: so}
	metrics, fallbackActive, err = fallback.GetMetricsWithFallback(soh, raw, rawErr, name, spec)
	return raw, metrics, active, fallbackActive, rawErr, err
}

// operatorStep is one turn of the operator's scale loop for the ScaledObject (checkScalers):
// its state from the scaler and the fallback, RequestScale, and the result in its status.
func (s *standin) operatorStep(ctx context.Context) {
	so, err := s.get(ctx)
	if err != nil {
		s.line("keda", "error=%q", err.Error())
		return
	}
	before, _ := s.replicas(ctx)
	raw, metrics, active, fb, rawErr, err := s.observe(ctx, so)
	isActive, isError := active || fb, err != nil
	var triggers []string
	if isActive {
		for _, m := range metrics {
			triggers = append(triggers, m.MetricName)
		}
	}
	result := s.exec.RequestScale(ctx, so, isActive, isError, executor.ScaleExecutorOptions{ActiveTriggers: triggers})
	// handleResult: conditions, last active time and trigger activity into the status.
	if perr := s.patchStatus(ctx, func(cur *kedav1alpha1.ScaledObject) {
		for _, c := range result.Conditions {
			cur.Status.Conditions.SetCondition(c.Type, c.Status, c.Reason, c.Message)
		}
		if result.LastActiveTime != nil {
			cur.Status.LastActiveTime = result.LastActiveTime
		}
		if result.TriggersActivity != nil {
			cur.Status.TriggersActivity = result.TriggersActivity
		}
	}); perr != nil {
		s.line("keda", "status-error=%q", perr.Error())
	}
	if isError {
		// The operator drops its scalers cache after an error and builds them again next time.
		if berr := s.build(ctx, so); berr != nil {
			s.line("keda", "rebuild-error=%q", berr.Error())
		}
	}
	after, ready := s.replicas(ctx)
	note := ""
	if result.Error != nil {
		note = " note=" + quote(result.Error.Error())
	} else if rawErr != nil {
		note = " scaler-error=" + quote(rawErr.Error())
	}
	s.line("keda", "lag=%s active=%t fallback=%t replicas=%d->%d ready=%d%s", lagOf(raw, rawErr), isActive, fb, before, after, ready, note)
}

// hpaStep is one reconcile of the HPA KEDA would have made for the ScaledObject: disabled at
// zero replicas (KEDA alone activates), else the replicas for KEDA's metric as
// metrics-apiserver would serve it (the scaler through the fallback again), set on the scale
// subresource.
func (s *standin) hpaStep(ctx context.Context, h *hpa) {
	gr := schema.GroupResource{Group: s.gvkr.Group, Resource: s.gvkr.Resource}
	sc, err := s.scales.Scales(s.ns).Get(ctx, gr, s.target, metav1.GetOptions{})
	if err != nil {
		s.line("hpa", "error=%q", err.Error())
		return
	}
	if sc.Spec.Replicas == 0 {
		s.line("hpa", "desired=0 replicas=0 note=%q", "ScalingDisabled: the target is at zero replicas")
		return
	}
	so, err := s.get(ctx)
	if err != nil {
		s.line("hpa", "error=%q", err.Error())
		return
	}
	raw, metrics, _, fb, rawErr, err := s.observe(ctx, so)
	if err != nil {
		_, ready := s.replicas(ctx)
		s.line("hpa", "lag=%s desired=%d replicas=%d->%d ready=%d note=%q", lagOf(raw, rawErr), sc.Spec.Replicas, sc.Spec.Replicas, sc.Spec.Replicas, ready, "FailedGetExternalMetric: "+err.Error())
		return
	}
	var usage int64
	for _, m := range metrics {
		usage += m.Value.MilliValue()
	}
	s.mu.RLock()
	target := s.spec.External.Target.AverageValue.MilliValue()
	s.mu.RUnlock()
	current := sc.Spec.Replicas
	desired, why := h.desired(current, sc.Status.Replicas, usage, target)
	if desired != current {
		sc.Spec.Replicas = desired
		if _, err := s.scales.Scales(s.ns).Update(ctx, gr, sc, metav1.UpdateOptions{}); err != nil {
			s.line("hpa", "error=%q", err.Error())
			return
		}
	}
	_, ready := s.replicas(ctx)
	note := ""
	if why != "" {
		note = " note=" + quote(why)
	}
	s.line("hpa", "lag=%s metric=%s fallback=%t desired=%d replicas=%d->%d ready=%d%s", lagOf(raw, rawErr), milli(usage), fb, desired, current, desired, ready, note)
}

// replicas returns the target Deployment's spec and ready replicas.
func (s *standin) replicas(ctx context.Context) (spec, ready int32) {
	d := &appsv1.Deployment{}
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: s.target}, d); err != nil {
		return -1, -1
	}
	return ptrOr(d.Spec.Replicas, 1), d.Status.ReadyReplicas
}

func (s *standin) line(loop, format string, args ...any) {
	fmt.Printf("step t=+%.1fs loop=%s %s\n", time.Since(s.start).Seconds(), loop, fmt.Sprintf(format, args...))
}

func lagOf(raw []external_metrics.ExternalMetricValue, err error) string {
	if err != nil || len(raw) == 0 {
		return "?"
	}
	return milli(raw[0].Value.MilliValue())
}

func milli(v int64) string {
	if v%1000 == 0 {
		return fmt.Sprint(v / 1000)
	}
	return fmt.Sprintf("%.3f", float64(v)/1000)
}

func quote(s string) string { return fmt.Sprintf("%q", strings.TrimSpace(s)) }

func behavior(so *kedav1alpha1.ScaledObject) *autoscalingv2.HorizontalPodAutoscalerBehavior {
	if so.Spec.Advanced == nil || so.Spec.Advanced.HorizontalPodAutoscalerConfig == nil {
		return nil
	}
	return so.Spec.Advanced.HorizontalPodAutoscalerConfig.Behavior
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}
