// Package helm tests the Boxcar chart in boxcar/: it renders it with the Helm SDK for the
// default values and for each optional feature, decodes every object strictly into its
// client-go type (or, for CRDs, a local struct), and holds the chart to the code it deploys:
// the worker's config loader and flags, the kubernetes sandbox backend's API calls and pod
// labels, and the metrics the worker exports.
package helm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/scheme"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/yaml"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/workercmd"
)

const (
	chartDir         = "boxcar"
	releaseName      = "boxcar"
	releaseNamespace = "boxcar"
)

// kinds the chart may render: true for built-in kinds, decoded into their client-go types;
// false for CRDs, decoded into the local structs of crd_test.go. Anything else (a typo, a
// removed apiVersion) fails the test.
var kinds = map[schema.GroupVersionKind]bool{
	{Version: "v1", Kind: "ConfigMap"}:                                              true,
	{Version: "v1", Kind: "Namespace"}:                                              true,
	{Version: "v1", Kind: "ResourceQuota"}:                                          true,
	{Version: "v1", Kind: "Secret"}:                                                 true,
	{Version: "v1", Kind: "Service"}:                                                true,
	{Version: "v1", Kind: "ServiceAccount"}:                                         true,
	{Group: "apps", Version: "v1", Kind: "Deployment"}:                              true,
	{Group: "batch", Version: "v1", Kind: "Job"}:                                    true,
	{Group: "autoscaling", Version: "v2", Kind: "HorizontalPodAutoscaler"}:          true,
	{Group: "networking.k8s.io", Version: "v1", Kind: "NetworkPolicy"}:              true,
	{Group: "policy", Version: "v1", Kind: "PodDisruptionBudget"}:                   true,
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "Role"}:               true,
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "RoleBinding"}:        true,
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRole"}:        true,
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRoleBinding"}: true,
	{Group: "keda.sh", Version: "v1alpha1", Kind: "ScaledObject"}:                   false,
	{Group: "monitoring.coreos.com", Version: "v1", Kind: "ServiceMonitor"}:         false,
	{Group: "monitoring.coreos.com", Version: "v1", Kind: "PrometheusRule"}:         false,
}

// rendered is one rendering of the chart: its objects, decoded, and NOTES.txt.
type rendered struct {
	values  common.Values // .Values after coalescing
	objects []object
	notes   string
}

// object is one rendered object, decoded strictly into Obj: a client-go type, or one of the
// local CRD structs.
type object struct {
	Template string
	GVK      schema.GroupVersionKind
	Name     string
	Obj      any
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return ch
}

// values turns YAML into chart values.
func values(t *testing.T, doc string) map[string]any {
	t.Helper()
	v := map[string]any{}
	if err := yaml.Unmarshal([]byte(doc), &v); err != nil {
		t.Fatalf("values %q: %v", doc, err)
	}
	return v
}

// renderValues checks vals against the chart's schema and coalesces them with the defaults,
// for release name in namespace ns.
func renderValues(ch *chart.Chart, name, ns string, vals map[string]any) (common.Values, error) {
	return chartutil.ToRenderValues(ch, vals,
		common.ReleaseOptions{Name: name, Namespace: ns, Revision: 1, IsInstall: true},
		common.DefaultCapabilities)
}

// testSigningSecret is the Secret every test install signs with unless its values say
// otherwise: the chart refuses to install without a key (TestSigningFailsClosed).
const testSigningSecret = "boxcar-signing"

// withSigningKey gives vals a signing key when they say nothing of signing.
func withSigningKey(vals map[string]any) map[string]any {
	if vals == nil {
		vals = map[string]any{}
	}
	if _, ok := vals["signing"]; !ok {
		vals["signing"] = map[string]any{"existingSecret": testSigningSecret}
	}
	return vals
}

// render renders the chart as `helm install` would and decodes every object strictly.
func render(t *testing.T, vals map[string]any) *rendered {
	t.Helper()
	r, err := tryRender(t, withSigningKey(vals))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// tryRender renders vals as they are, returning the chart's refusal as an error.
func tryRender(t *testing.T, vals map[string]any) (*rendered, error) {
	t.Helper()
	return tryRenderRelease(t, releaseName, releaseNamespace, vals)
}

// tryRenderRelease renders vals for release name in namespace ns.
func tryRenderRelease(t *testing.T, name, ns string, vals map[string]any) (*rendered, error) {
	t.Helper()
	ch := loadChart(t)
	top, err := renderValues(ch, name, ns, vals)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	files, err := engine.Render(ch, top)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	r := &rendered{values: top["Values"].(common.Values)}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		text := files[name]
		switch {
		case strings.HasSuffix(name, "NOTES.txt"):
			r.notes = text
			continue
		case strings.HasSuffix(name, ".tpl"):
			continue
		}
		for _, doc := range releaseutil.SplitManifests(text) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			r.objects = append(r.objects, decode(t, name, doc))
		}
	}
	return r, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for line := range strings.Lines(doc) {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line)
		}
	}
	return b.String()
}

var strictCodecs = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict)

// decode turns one YAML document into its typed object; unknown or duplicate fields fail.
func decode(t *testing.T, template, doc string) object {
	t.Helper()
	var head struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   metav1.ObjectMeta `json:"metadata"`
	}
	if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
		t.Fatalf("%s: not YAML: %v\n%s", template, err, doc)
	}
	gv, err := schema.ParseGroupVersion(head.APIVersion)
	if err != nil {
		t.Fatalf("%s: apiVersion %q: %v", template, head.APIVersion, err)
	}
	gvk := gv.WithKind(head.Kind)
	o := object{Template: template, GVK: gvk, Name: head.Metadata.Name}
	typed, known := kinds[gvk]
	if typed {
		obj, got, err := strictCodecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("%s: %s %s does not decode strictly: %v\n%s", template, gvk.Kind, o.Name, err, doc)
		}
		if *got != gvk {
			t.Fatalf("%s: decoded as %s, want %s", template, got, gvk)
		}
		o.Obj = obj
		return o
	}
	var crd any
	switch {
	case known && gvk.Kind == "ScaledObject":
		crd = &scaledObject{}
	case known && gvk.Kind == "ServiceMonitor":
		crd = &serviceMonitor{}
	case known && gvk.Kind == "PrometheusRule":
		crd = &prometheusRule{}
	default:
		t.Fatalf("%s: unexpected kind %s (%s)", template, gvk.Kind, head.APIVersion)
	}
	js, err := yaml.YAMLToJSONStrict([]byte(doc))
	if err != nil {
		t.Fatalf("%s: %v", template, err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(crd); err != nil {
		t.Fatalf("%s: %s %s does not decode strictly: %v\n%s", template, gvk.Kind, o.Name, err, doc)
	}
	o.Obj = crd
	return o
}

// all returns the objects of type T.
func all[T any](r *rendered) []T {
	var out []T
	for _, o := range r.objects {
		if v, ok := o.Obj.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// one returns the single object of type T whose name matches, failing otherwise.
func one[T interface{ GetName() string }](t *testing.T, r *rendered, name string) T {
	t.Helper()
	var found []T
	for _, v := range all[T](r) {
		if name == "" || v.GetName() == name {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("%d %T named %q, want 1", len(found), zero, name)
	}
	return found[0]
}

// workerConfig is the worker config in the chart's ConfigMap, read by the worker's own loader.
func workerConfig(t *testing.T, r *rendered) config.Config {
	t.Helper()
	cm := one[*corev1.ConfigMap](t, r, fullname)
	text, ok := cm.Data["boxcar.yaml"]
	if !ok {
		t.Fatalf("ConfigMap %s has no boxcar.yaml", cm.Name)
	}
	cfg, err := config.Parse([]byte(text))
	if err != nil {
		t.Fatalf("the worker rejects the chart's config: %v\n%s", err, text)
	}
	return cfg
}

const fullname = "boxcar" // the release is named like the chart

// features are the renderings the tests check: the defaults and each optional feature on.
var features = []struct {
	name   string
	values string
}{
	{name: "defaults"},
	{name: "keda", values: "keda: {enabled: true}"},
	{name: "service monitor", values: "metrics: {serviceMonitor: {enabled: true, labels: {release: prom}}}"},
	{name: "prometheus rule", values: "metrics: {prometheusRule: {enabled: true}}"},
	{name: "grafana dashboard", values: "grafana: {dashboard: {enabled: true}}"},
	{name: "signing key from a Secret", values: "signing: {existingSecret: my-key}"},
	{name: "signing key in values", values: "signing: {privateKey: " + testPrivateKey + "}"},
	{name: "unsigned", values: "signing: {enabled: false}"},
	{name: "NATS credentials", values: "natsServer: {credentialsSecret: {name: boxcar-nats, key: worker.creds}}"},
	{name: "NATS credentials over mTLS", values: "natsServer: {credentialsSecret: {name: boxcar-nats}, tlsSecret: {name: boxcar-nats-tls}}\nconfig: {nats: {url: 'tls://nats.nats:4222'}}"},
	{name: "NATS with generated identities", values: "natsServer: {credentialsSecret: {name: boxcar-nats-worker}, operatorCredentialsSecret: {name: boxcar-nats-operator, key: operator.creds}}"},
	{name: "NATS with generated identities over mTLS", values: "natsServer: {credentialsSecret: {name: boxcar-nats-worker}, operatorCredentialsSecret: {name: boxcar-nats-operator}, tlsSecret: {name: boxcar-nats-tls}}\nconfig: {nats: {url: 'tls://nats.nats:4222'}}"},
	{name: "NATS over TLS with a private CA only", values: "natsServer: {tlsSecret: {name: boxcar-nats-ca, caKey: ca.pem, certKey: ''}}"},
	{name: "no worker network policy, no quota", values: "networkPolicy: {enabled: false}\nsandboxes: {resourceQuota: {enabled: false}}"},
	{name: "overrides", values: overrides},
	{name: "fixed replicas", values: "autoscaling: {enabled: false}\nreplicas: 3"},
	{name: "workload identity, namespace managed elsewhere", values: "s3: {credentialsSecret: {name: ''}}\nsandboxes: {createNamespace: false, readNamespace: false, networkPolicy: {enabled: false}}"},
	{name: "many jobs with long transcripts", values: "config: {concurrency: 16, profiles: {file-summary: {limits: {max_transcript_bytes: 50000000}}}}"},
	{name: "everything", values: `
keda: {enabled: true}
metrics: {serviceMonitor: {enabled: true}, prometheusRule: {enabled: true}}
grafana: {dashboard: {enabled: true}}
signing: {existingSecret: boxcar-signing, key: ed25519.pem}
natsServer: {credentialsSecret: {name: boxcar-nats}, operatorCredentialsSecret: {name: boxcar-nats-operator}}
logLevel: debug
`},
}

// TestSandboxPullPolicyReachesTheWorker: a cluster whose nodes have no registry sets the
// sandbox pods' pull policy in the values, and the worker's config carries it.
func TestSandboxPullPolicyReachesTheWorker(t *testing.T) {
	for _, policy := range []string{"", "Never", "Always"} {
		vals := ""
		want := "IfNotPresent"
		if policy != "" {
			vals, want = "sandboxes: {imagePullPolicy: "+policy+"}", policy
		}
		cfg := workerConfig(t, render(t, values(t, vals)))
		if got := cfg.Sandbox.Kubernetes.ImagePullPolicy; got != want {
			t.Errorf("values %q: worker config image_pull_policy = %q, want %q", vals, got, want)
		}
	}
}

func TestChartRenders(t *testing.T) {
	for _, f := range features {
		t.Run(f.name, func(t *testing.T) {
			r := render(t, values(t, f.values))
			v := r.values
			enabled := func(path string) bool {
				b, _ := lookup(v, path).(bool)
				return b
			}
			keda := enabled("keda.enabled")
			setup := lookup(v, "natsServer.operatorCredentialsSecret.name") != ""
			want := map[string]int{
				"ConfigMap": 2, "Deployment": 1, "ServiceAccount": 1, "Role": 1, "RoleBinding": 1,
				"Service": 1, "PodDisruptionBudget": 1,
				"Namespace":               b2i(enabled("sandboxes.createNamespace")),
				"ClusterRole":             b2i(enabled("sandboxes.readNamespace")),
				"ClusterRoleBinding":      b2i(enabled("sandboxes.readNamespace")),
				"NetworkPolicy":           b2i(enabled("sandboxes.networkPolicy.enabled")) + b2i(enabled("networkPolicy.enabled")),
				"ResourceQuota":           b2i(enabled("sandboxes.resourceQuota.enabled")),
				"Secret":                  b2i(enabled("signing.enabled") && lookup(v, "signing.privateKey") != ""),
				"HorizontalPodAutoscaler": b2i(enabled("autoscaling.enabled") && !keda),
				"ScaledObject":            b2i(keda),
				"ServiceMonitor":          b2i(enabled("metrics.serviceMonitor.enabled")),
				"PrometheusRule":          b2i(enabled("metrics.prometheusRule.enabled")),
				"Job":                     b2i(setup),
			}
			if enabled("grafana.dashboard.enabled") {
				want["ConfigMap"]++
			}
			if setup {
				want["ConfigMap"]++ // the setup hook's own
				want["NetworkPolicy"] += b2i(enabled("networkPolicy.enabled"))
			}
			got := map[string]int{}
			for _, o := range r.objects {
				got[o.GVK.Kind]++
				checkMeta(t, o)
			}
			for kind, n := range want {
				if got[kind] != n {
					t.Errorf("%d %s, want %d", got[kind], kind, n)
				}
			}
			for kind := range got {
				if _, ok := want[kind]; !ok {
					t.Errorf("unexpected %s", kind)
				}
			}

			cfg := workerConfig(t, r)
			checkDeployment(t, r, cfg)
			checkRBAC(t, r, cfg)
			checkSandboxNamespace(t, r, cfg)
			checkWorkerNetworkPolicy(t, r, cfg)
			checkService(t, r)
			checkScaling(t, r, cfg)
			checkMonitoring(t, r)
			checkSetupJob(t, r)
			if !strings.Contains(r.notes, "rollout status deployment/"+fullname) {
				t.Errorf("NOTES.txt lacks the rollout command:\n%s", r.notes)
			}
		})
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// lookup follows a dotted path through nested values.
func lookup(v map[string]any, path string) any {
	var cur any = v
	for _, k := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			if cv, ok := cur.(common.Values); ok {
				m = cv
			} else {
				return nil
			}
		}
		cur = m[k]
	}
	return cur
}

// checkMeta holds every object to valid names and labels and an explicit namespace.
func checkMeta(t *testing.T, o object) {
	t.Helper()
	acc, ok := o.Obj.(metav1.Object)
	if !ok {
		acc = crdMeta(o.Obj)
	}
	for _, msg := range validation.IsDNS1123Subdomain(acc.GetName()) {
		t.Errorf("%s %s: name: %s", o.GVK.Kind, acc.GetName(), msg)
	}
	if !slices.Contains([]string{"Namespace", "ClusterRole", "ClusterRoleBinding"}, o.GVK.Kind) && acc.GetNamespace() == "" {
		t.Errorf("%s %s: no namespace: every namespaced object names its namespace", o.GVK.Kind, acc.GetName())
	}
	for k, v := range acc.GetLabels() {
		for _, msg := range append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...) {
			t.Errorf("%s %s: label %s=%s: %s", o.GVK.Kind, acc.GetName(), k, v, msg)
		}
	}
}

func checkDeployment(t *testing.T, r *rendered, cfg config.Config) {
	t.Helper()
	d := one[*appsv1.Deployment](t, r, fullname)
	if d.Namespace != releaseNamespace {
		t.Errorf("Deployment in %q, want the release namespace", d.Namespace)
	}
	pod := d.Spec.Template
	if sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector); err != nil || !sel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("Deployment selector %v does not select its pods %v (%v)", d.Spec.Selector, pod.Labels, err)
	}

	// Pod Security Standards "restricted", as the admission plugin evaluates it.
	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range eval.EvaluatePod(psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}, &pod.ObjectMeta, &pod.Spec) {
		if !res.Allowed {
			t.Errorf("worker pod violates the restricted Pod Security Standard: %s: %s", res.ForbiddenReason, res.ForbiddenDetail)
		}
	}

	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("worker root filesystem is writable")
	}
	for name, q := range map[string]bool{
		"requests.cpu": !c.Resources.Requests.Cpu().IsZero(), "requests.memory": !c.Resources.Requests.Memory().IsZero(),
		"limits.cpu": !c.Resources.Limits.Cpu().IsZero(), "limits.memory": !c.Resources.Limits.Memory().IsZero(),
	} {
		if !q {
			t.Errorf("worker resources.%s not set", name)
		}
	}

	// Probes on the port the worker's config serves metrics on.
	_, port, err := net.SplitHostPort(cfg.MetricsAddr)
	if err != nil {
		t.Fatalf("metrics_addr %q: %v", cfg.MetricsAddr, err)
	}
	var metricsPort *corev1.ContainerPort
	for i, p := range c.Ports {
		if p.Name == "metrics" {
			metricsPort = &c.Ports[i]
		}
	}
	if metricsPort == nil || fmt.Sprint(metricsPort.ContainerPort) != port {
		t.Fatalf("container port metrics = %v, want the config's metrics_addr port %s", metricsPort, port)
	}
	for probe, want := range map[*corev1.Probe]string{c.LivenessProbe: "/healthz", c.ReadinessProbe: "/readyz"} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != want || probe.HTTPGet.Port.String() != "metrics" {
			t.Errorf("probe %+v, want GET %s on port metrics", probe, want)
		}
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.TimeoutSeconds < 4 {
		t.Errorf("readiness probe timeout %ds is shorter than /readyz may take (3s)", c.ReadinessProbe.TimeoutSeconds)
	}

	// Drain: the kubelet waits longer than the worker's drain grace before it kills the pod.
	grace := pod.Spec.TerminationGracePeriodSeconds
	if grace == nil || time.Duration(*grace)*time.Second <= time.Duration(cfg.DrainGrace)+30*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v is not above drain_grace %s plus time to close sandboxes", grace, time.Duration(cfg.DrainGrace))
	}

	// Secrets come from Secrets, never from values.
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	secretEnv := []string{"OPENAI_API_KEY"}
	if name, _ := lookup(r.values, "s3.credentialsSecret.name").(string); name != "" {
		secretEnv = append(secretEnv, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
	} else if _, ok := env["AWS_ACCESS_KEY_ID"]; ok {
		t.Error("AWS_ACCESS_KEY_ID set without a credentials Secret")
	}
	for _, name := range secretEnv {
		e, ok := env[name]
		if !ok || e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			t.Errorf("env %s = %+v, want it from a Secret", name, e)
		}
	}

	// The args are flags the worker knows, and the files they name are mounted.
	mounts := map[string]corev1.Volume{}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = vols[m.Name]
		if _, ok := vols[m.Name]; !ok {
			t.Errorf("mount of unknown volume %s", m.Name)
		}
	}
	checkTmp(t, env, mounts, cfg)
	checkWorkerFlags(t, c.Args)
	flags := map[string]string{}
	for _, a := range c.Args {
		k, v, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		flags[k] = v
	}
	if v := mounts[dir(flags["config"])]; v.ConfigMap == nil || v.ConfigMap.Name != fullname {
		t.Errorf("--config=%s is not in the mounted ConfigMap %s", flags["config"], fullname)
	}
	signed, _ := lookup(r.values, "signing.enabled").(bool)
	secret, _ := lookup(r.values, "signing.existingSecret").(string)
	if secret == "" {
		secret = fullname + "-signing"
	}
	key, hasKey := flags["signing-key"]
	switch {
	case !signed && hasKey:
		t.Errorf("--signing-key=%s with signing.enabled false", key)
	case signed && !hasKey:
		t.Errorf("signing.enabled and no --signing-key: %q", c.Args)
	case signed:
		v := mounts[dir(key)]
		if v.Secret == nil || v.Secret.SecretName != secret {
			t.Fatalf("--signing-key=%q is not in a volume of Secret %s", key, secret)
		}
		wantKey, _ := lookup(r.values, "signing.key").(string)
		if len(v.Secret.Items) != 1 || v.Secret.Items[0].Key != wantKey || dir(key)+"/"+v.Secret.Items[0].Path != key {
			t.Errorf("signing key volume items %+v, want key %s at %s", v.Secret.Items, wantKey, key)
		}
		// A non-root worker reads it through the pod's fsGroup; nobody else may.
		if m := v.Secret.DefaultMode; m == nil || *m&0o007 != 0 || *m&0o040 == 0 || pod.Spec.SecurityContext.FSGroup == nil {
			t.Errorf("signing key mode %v with fsGroup %v, want group-readable only", m, pod.Spec.SecurityContext.FSGroup)
		}
	}

	checkNATSCredentials(t, r, flags, env, mounts)
	checkNATSTLS(t, r, flags, mounts)

	// Replicas belong to the autoscaler when there is one.
	scaled := lookup(r.values, "keda.enabled") == true || lookup(r.values, "autoscaling.enabled") == true
	if scaled != (d.Spec.Replicas == nil) {
		t.Errorf("replicas %v with an autoscaler: %v", d.Spec.Replicas, scaled)
	}
}

// checkTmp: the worker's temporary folder (TMPDIR, else /tmp) is an emptyDir large
// enough for a transcript spool of each job it runs at once, at its profile's
// max_transcript_bytes (internal/runner/spool.go): past its sizeLimit the kubelet evicts the
// worker and every job it runs.
func checkTmp(t *testing.T, env map[string]corev1.EnvVar, mounts map[string]corev1.Volume, cfg config.Config) {
	t.Helper()
	tmp := "/tmp"
	if e, ok := env["TMPDIR"]; ok {
		tmp = e.Value
	}
	v, ok := mounts[tmp]
	if !ok || v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil {
		t.Fatalf("the worker's temporary folder %s is not an emptyDir with a size limit: %+v", tmp, v)
	}
	var largest int64
	for _, p := range cfg.Profiles {
		largest = max(largest, p.Limits.MaxTranscriptBytes)
	}
	need := int64(cfg.Concurrency) * largest
	if got := v.EmptyDir.SizeLimit.Value(); got < need {
		t.Errorf("%s sizeLimit %s (%d bytes) holds less than %d transcripts of %d bytes (concurrency × max_transcript_bytes, %d bytes)",
			tmp, v.EmptyDir.SizeLimit, got, cfg.Concurrency, largest, need)
	}
}

func dir(p string) string {
	if i := strings.LastIndex(p, "/"); i > 0 {
		return p[:i]
	}
	return p
}

// checkWorkerFlags runs the worker's own flag parsing on args: an unknown flag fails; -h stops
// it before anything starts.
func checkWorkerFlags(t *testing.T, args []string) {
	t.Helper()
	var stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := workercmd.Run(ctx, append(slices.Clone(args), "-h"), func(string) string { return "" }, io.Discard, &stderr)
	if err != nil {
		t.Errorf("the worker rejects the chart's args %q: %v", args, err)
	}
}

func checkRBAC(t *testing.T, r *rendered, cfg config.Config) {
	t.Helper()
	ns := cfg.Sandbox.Kubernetes.Namespace
	role := one[*rbacv1.Role](t, r, "")
	binding := one[*rbacv1.RoleBinding](t, r, "")
	sa := one[*corev1.ServiceAccount](t, r, "")
	d := one[*appsv1.Deployment](t, r, fullname)
	if role.Namespace != ns || binding.Namespace != ns {
		t.Errorf("Role in %q, RoleBinding in %q, want the sandbox namespace %q", role.Namespace, binding.Namespace, ns)
	}
	if binding.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name}) {
		t.Errorf("RoleBinding refers to %+v, want Role %s", binding.RoleRef, role.Name)
	}
	want := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}
	if len(binding.Subjects) != 1 || binding.Subjects[0] != want {
		t.Errorf("RoleBinding subjects %+v, want %+v", binding.Subjects, want)
	}
	if len(all[*rbacv1.ClusterRole](r)) > 0 { // none with sandboxes.readNamespace=false
		checkNamespaceReader(t, r, ns, want)
	}
	if d.Spec.Template.Spec.ServiceAccountName != sa.Name {
		t.Errorf("worker runs as %q, want ServiceAccount %s", d.Spec.Template.Spec.ServiceAccountName, sa.Name)
	}
	if d.Spec.Template.Spec.AutomountServiceAccountToken == nil || !*d.Spec.Template.Spec.AutomountServiceAccountToken {
		t.Error("the worker needs its token for the API server")
	}
}

// checkNamespaceReader: the ClusterRole lets the workers get their sandbox namespace ns and
// nothing else, bound to their ServiceAccount sa. The namespace's own answer tells its deletion
// from a refusal of theirs (TestClusterRoleGrantsTheNamespaceRead).
func checkNamespaceReader(t *testing.T, r *rendered, ns string, sa rbacv1.Subject) {
	t.Helper()
	cr := one[*rbacv1.ClusterRole](t, r, "")
	crb := one[*rbacv1.ClusterRoleBinding](t, r, "")
	wantRules := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces"}, ResourceNames: []string{ns}, Verbs: []string{"get"}}}
	if !equality.Semantic.DeepEqual(cr.Rules, wantRules) {
		t.Errorf("ClusterRole rules %+v, want %+v", cr.Rules, wantRules)
	}
	if crb.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: cr.Name}) || len(crb.Subjects) != 1 || crb.Subjects[0] != sa {
		t.Errorf("ClusterRoleBinding refers to %+v for %+v, want ClusterRole %s for %+v", crb.RoleRef, crb.Subjects, cr.Name, sa)
	}
}

func checkSandboxNamespace(t *testing.T, r *rendered, cfg config.Config) {
	t.Helper()
	ns := cfg.Sandbox.Kubernetes.Namespace
	for _, n := range all[*corev1.Namespace](r) {
		if n.Name != ns {
			t.Errorf("Namespace %s, want only the sandbox namespace %s", n.Name, ns)
		}
		for _, label := range []string{psaapi.EnforceLevelLabel, psaapi.AuditLevelLabel, psaapi.WarnLevelLabel} {
			if n.Labels[label] != string(psaapi.LevelRestricted) {
				t.Errorf("Namespace %s labels %v, want %s=restricted", n.Name, n.Labels, label)
			}
		}
	}
	if ns == releaseNamespace {
		t.Errorf("sandbox namespace %s is the release's", ns)
	}
	for _, np := range all[*networkingv1.NetworkPolicy](r) {
		if np.Namespace != ns {
			continue // the workers' own: checkWorkerNetworkPolicy
		}
		types := slices.Sorted(slices.Values(np.Spec.PolicyTypes))
		if !slices.Equal(types, []networkingv1.PolicyType{networkingv1.PolicyTypeEgress, networkingv1.PolicyTypeIngress}) {
			t.Errorf("NetworkPolicy types %v, want Ingress and Egress", np.Spec.PolicyTypes)
		}
		if len(np.Spec.Ingress) != 0 || len(np.Spec.Egress) != 0 {
			t.Errorf("NetworkPolicy allows traffic: ingress %v, egress %v", np.Spec.Ingress, np.Spec.Egress)
		}
		// Every pod of the namespace, not only those labelled as sandboxes.
		if sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector); err != nil || !sel.Empty() {
			t.Errorf("NetworkPolicy %s selector %v (%v): it must select the whole sandbox namespace", np.Name, np.Spec.PodSelector, err)
		}
	}
	for _, q := range all[*corev1.ResourceQuota](r) {
		if q.Namespace != ns || q.Spec.Hard.Pods().IsZero() {
			t.Errorf("ResourceQuota %s in %s bounds pods to %v; want it in %s with a pod count", q.Name, q.Namespace, q.Spec.Hard.Pods(), ns)
		}
	}
}

func checkService(t *testing.T, r *rendered) {
	t.Helper()
	svc := one[*corev1.Service](t, r, fullname+"-metrics")
	d := one[*appsv1.Deployment](t, r, fullname)
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) || len(svc.Spec.Selector) == 0 {
		t.Errorf("Service selector %v does not select the worker pods %v", svc.Spec.Selector, d.Spec.Template.Labels)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
		t.Errorf("Service ports %+v, want one named metrics to the pods' metrics port", svc.Spec.Ports)
	}
	pdb := one[*policyv1.PodDisruptionBudget](t, r, "")
	if sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("PodDisruptionBudget selector %v does not select the worker pods", pdb.Spec.Selector)
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MinAvailable != nil {
		t.Errorf("PodDisruptionBudget %+v: use maxUnavailable, so that a single worker can still be drained", pdb.Spec)
	}
}

func checkScaling(t *testing.T, r *rendered, cfg config.Config) {
	t.Helper()
	for _, h := range all[*autoscalingv2.HorizontalPodAutoscaler](r) {
		ref := h.Spec.ScaleTargetRef
		if ref.Kind != "Deployment" || ref.Name != fullname || ref.APIVersion != "apps/v1" {
			t.Errorf("HPA scales %+v, want the worker Deployment", ref)
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 1 || h.Spec.MaxReplicas < *h.Spec.MinReplicas {
			t.Errorf("HPA replicas %v..%d", h.Spec.MinReplicas, h.Spec.MaxReplicas)
		}
	}
	for _, so := range all[*scaledObject](r) {
		ref := so.Spec.ScaleTargetRef
		if ref.Kind != "Deployment" || ref.Name != fullname {
			t.Errorf("ScaledObject scales %+v, want the worker Deployment", ref)
		}
		// One trigger per tenant, on the stream and the tenant's consumer the workers use, as
		// the worker's config loader resolves them.
		tenants := slices.Sorted(maps.Keys(cfg.TenantsOrDefault()))
		if len(so.Spec.Triggers) != len(tenants) {
			t.Fatalf("ScaledObject triggers %+v, want one nats-jetstream per tenant %v", so.Spec.Triggers, tenants)
		}
		for i, tenant := range tenants {
			tr := so.Spec.Triggers[i]
			if want, stream := cfg.NATS.Consumer+"-"+tenant, queue.JobStream(cfg.NATS, tenant); tr.Type != "nats-jetstream" || tr.Metadata["stream"] != stream || tr.Metadata["consumer"] != want {
				t.Errorf("trigger %d %s watches %s/%s, want the workers' %s/%s", i, tr.Type, tr.Metadata["stream"], tr.Metadata["consumer"], stream, want)
			}
		}
		md := so.Spec.Triggers[0].Metadata
		for _, k := range []string{"natsServerMonitoringEndpoint", "account", "lagThreshold"} {
			if md[k] == "" {
				t.Errorf("trigger metadata lacks %s: %v", k, md)
			}
		}
		var lag int
		if _, err := fmt.Sscanf(md["lagThreshold"], "%d", &lag); err != nil || lag < 1 {
			t.Errorf("lagThreshold %q, want a positive number", md["lagThreshold"])
		}
		if so.Spec.MinReplicaCount == nil || so.Spec.MaxReplicaCount == nil || *so.Spec.MaxReplicaCount < max(*so.Spec.MinReplicaCount, 1) {
			t.Fatalf("ScaledObject replicas %v..%v", so.Spec.MinReplicaCount, so.Spec.MaxReplicaCount)
		}
		// With the workers at zero and the scaler failing, only a fallback brings one back.
		// KEDA takes a fallback only for an AverageValue trigger, the default.
		if fb := so.Spec.Fallback; fb == nil || fb.Replicas < 1 || fb.Replicas > *so.Spec.MaxReplicaCount || fb.FailureThreshold < 1 {
			t.Errorf("ScaledObject fallback %+v, want 1..%d replicas after at least one failure", fb, *so.Spec.MaxReplicaCount)
		}
		if mt := so.Spec.Triggers[0].MetricType; mt != "" && mt != "AverageValue" {
			t.Errorf("trigger metricType %s: KEDA ignores the fallback unless it is AverageValue", mt)
		}
		checkNATSNamespaces(t, cfg.NATS.URL, md["natsServerMonitoringEndpoint"])
	}
}

func checkMonitoring(t *testing.T, r *rendered) {
	t.Helper()
	svc := one[*corev1.Service](t, r, fullname+"-metrics")
	for _, sm := range all[*serviceMonitor](r) {
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(svc.Labels)) {
			t.Errorf("ServiceMonitor selector %v does not select Service %s %v", sm.Spec.Selector, svc.Name, svc.Labels)
		}
		if !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{releaseNamespace}) {
			t.Errorf("ServiceMonitor namespaces %v", sm.Spec.NamespaceSelector.MatchNames)
		}
		for _, ep := range sm.Spec.Endpoints {
			if ep.Port != svc.Spec.Ports[0].Name || ep.Path != "/metrics" {
				t.Errorf("ServiceMonitor endpoint %+v, want port %s path /metrics", ep, svc.Spec.Ports[0].Name)
			}
		}
		if want := lookup(r.values, "metrics.serviceMonitor.labels.release"); want != nil && sm.Metadata.Labels["release"] != want {
			t.Errorf("ServiceMonitor labels %v lack release=%v", sm.Metadata.Labels, want)
		}
	}
	for _, pr := range all[*prometheusRule](r) {
		checkRules(t, pr)
	}
	for _, cm := range all[*corev1.ConfigMap](r) {
		if cm.Name == fullname+"-dashboard" {
			if cm.Labels["grafana_dashboard"] != "1" {
				t.Errorf("dashboard ConfigMap labels %v lack the Grafana sidecar's grafana_dashboard=1", cm.Labels)
			}
			checkDashboard(t, []byte(cm.Data["boxcar.json"]))
		}
	}
}

// crdMeta gives the metadata of a CRD struct.
func crdMeta(obj any) metav1.Object {
	switch o := obj.(type) {
	case *scaledObject:
		return &o.Metadata
	case *serviceMonitor:
		return &o.Metadata
	case *prometheusRule:
		return &o.Metadata
	}
	panic(fmt.Sprintf("no metadata for %T", obj))
}

// TestSandboxBridgeImageIsTheWorkers: sandbox pods copy the egress tunnel from the worker's
// own image, so the worker's config names the image its Deployment runs.
func TestSandboxBridgeImageIsTheWorkers(t *testing.T) {
	for _, vals := range []string{"", "image: {repository: registry.example/boxcar, tag: v9}"} {
		r := render(t, values(t, vals))
		d := one[*appsv1.Deployment](t, r, fullname)
		if got, want := workerConfig(t, r).Sandbox.Kubernetes.BridgeImage, d.Spec.Template.Spec.Containers[0].Image; got != want || got == "" {
			t.Errorf("values %q: bridge_image = %q, want the worker's image %q", vals, got, want)
		}
	}
}

// TestLongReleaseNames: the names of a release named as long as Helm allows (53 characters),
// or given a fullnameOverride of 63, are names the API server takes for each kind: a Service's
// a DNS-1035 label, a Job's at most 63 characters (its pods' job-name label), and what the
// alerts and NOTES.txt name is the Service there is. <fullname>-metrics and <fullname>-setup
// ran past 63 characters, and the install failed at the API server's refusal of the Service.
func TestLongReleaseNames(t *testing.T) {
	const setup = "natsServer: {credentialsSecret: {name: nats-worker}, operatorCredentialsSecret: {name: nats-operator}}\nmetrics: {prometheusRule: {enabled: true}, serviceMonitor: {enabled: true}}"
	for _, tt := range []struct{ release, values string }{
		{release: strings.Repeat("r", 53), values: setup},
		{release: "boxcar", values: setup + "\nfullnameOverride: " + strings.Repeat("f", 63)},
		{release: strings.Repeat("x", 46) + "-boxcar", values: setup},
	} {
		t.Run(tt.release+" "+tt.values[len(setup):], func(t *testing.T) {
			r, err := tryRenderRelease(t, tt.release, releaseNamespace, withSigningKey(values(t, tt.values)))
			if err != nil {
				t.Fatal(err)
			}
			var service string
			for _, o := range r.objects {
				checkMeta(t, o)
				var msgs []string
				switch obj := o.Obj.(type) {
				case *corev1.Service:
					service = obj.Name
					msgs = validation.IsDNS1035Label(obj.Name)
				case *batchv1.Job:
					msgs = validation.IsDNS1123Label(obj.Name)
				}
				for _, msg := range msgs {
					t.Errorf("%s %s: name: %s", o.GVK.Kind, o.Name, msg)
				}
			}
			if service == "" || !strings.Contains(r.notes, "service/"+service+" ") {
				t.Errorf("NOTES.txt names no Service %q:\n%s", service, r.notes)
			}
			for _, rule := range all[*prometheusRule](r) {
				for _, g := range rule.Spec.Groups {
					for _, a := range g.Rules {
						if strings.Contains(a.Expr, "service=") && !strings.Contains(a.Expr, `service="`+service+`"`) {
							t.Errorf("alert %s reads another Service than %q: %s", a.Alert, service, a.Expr)
						}
					}
				}
			}
		})
	}
}

// TestLongNamesStayApart: two releases in one namespace whose fullnames differ only past the
// characters boxcar.suffixed keeps (fullnameOverrides of 63 sharing their first 60, or the
// longest release names) name every object apart: a shortened name carries a digest of the
// whole fullname, and a name that fits is <fullname>-<suffix> as before. Each release's
// -metrics Service, -setup hook, -worker NetworkPolicy and -signing Secret were the other's.
func TestLongNamesStayApart(t *testing.T) {
	const setup = "natsServer: {credentialsSecret: {name: nats-worker}, operatorCredentialsSecret: {name: nats-operator}}\nmetrics: {prometheusRule: {enabled: true}, serviceMonitor: {enabled: true}}\ngrafana: {dashboard: {enabled: true}}\nsigning: {privateKey: %q}"
	long := strings.Repeat("f", 60)
	for _, pair := range [][2]struct{ release, values string }{
		{{release: "a", values: "fullnameOverride: " + long + "one"}, {release: "b", values: "fullnameOverride: " + long + "two"}},
		{{release: strings.Repeat("r", 52) + "1"}, {release: strings.Repeat("r", 52) + "2"}},
		{{release: strings.Repeat("x", 46) + "-boxcar"}, {release: strings.Repeat("x", 45) + "-boxcar2"}},
	} {
		seen := map[string]string{}
		for _, rel := range pair {
			r, err := tryRenderRelease(t, rel.release, releaseNamespace, values(t, fmt.Sprintf(setup, testPrivateKeyPEM)+"\n"+rel.values))
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range r.objects {
				ns := ""
				if m, ok := o.Obj.(metav1.Object); ok {
					ns = m.GetNamespace()
				}
				if o.GVK.Kind == "Namespace" {
					continue // the sandbox namespace is the releases' to share
				}
				key := o.GVK.Kind + " " + ns + "/" + o.Name
				if other, ok := seen[key]; ok && other != rel.release {
					t.Errorf("releases %s and %s both name %s", other, rel.release, key)
				}
				seen[key] = rel.release
			}
		}
	}
	// A name of 63 characters is as it was: upgrades keep their objects.
	fits := strings.Repeat("f", 55)
	r := render(t, values(t, "fullnameOverride: "+fits))
	one[*corev1.Service](t, r, fits+"-metrics")
}
