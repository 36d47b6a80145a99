package helm

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"net/netip"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// testPrivateKeyPEM is a real ed25519 signing key, as `submit keygen` writes it; testPrivateKey
// is the same as a YAML scalar for values.
var (
	testPrivateKeyPEM = newPrivateKeyPEM()
	testPrivateKey    = strconv.Quote(testPrivateKeyPEM)
)

func newPrivateKeyPEM() string {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		panic(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

// overrides are the pod and container settings a platform team adds (issue 27).
const overrides = `
podSecurityContext: {runAsUser: 10001, runAsGroup: 10001, fsGroup: 10001}
securityContext: {capabilities: {drop: [ALL]}}
extraEnv:
  - {name: HTTPS_PROXY, value: "http://proxy.corp.example:3128"}
  - {name: CORP_TOKEN, valueFrom: {secretKeyRef: {name: corp, key: token}}}
extraVolumes:
  - {name: corp-ca, configMap: {name: corp-ca}}
extraVolumeMounts:
  - {name: corp-ca, mountPath: /etc/ssl/corp, readOnly: true}
`

// TestOverridesReachThePod: extraEnv, extraVolumes, extraVolumeMounts and the security
// contexts land in the worker pod, merged onto the chart's own settings, which keep the pod
// "restricted" (checkDeployment, through TestChartRenders' "overrides").
func TestOverridesReachThePod(t *testing.T) {
	r := render(t, values(t, overrides))
	pod := one[*appsv1.Deployment](t, r, fullname).Spec.Template.Spec
	c := pod.Containers[0]
	if sc := pod.SecurityContext; sc.RunAsUser == nil || *sc.RunAsUser != 10001 || sc.FSGroup == nil || *sc.FSGroup != 10001 ||
		sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.SeccompProfile == nil {
		t.Errorf("pod securityContext %+v, want runAsUser and fsGroup 10001 over the chart's non-root, seccomp defaults", sc)
	}
	if sc := c.SecurityContext; sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("container securityContext %+v lost the chart's defaults", sc)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if env["HTTPS_PROXY"].Value != "http://proxy.corp.example:3128" || env["CORP_TOKEN"].ValueFrom == nil || env["OPENAI_API_KEY"].ValueFrom == nil {
		t.Errorf("env %+v, want the chart's and the extra variables", c.Env)
	}
	if !slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == "corp-ca" && v.ConfigMap != nil }) ||
		!slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "corp-ca" && m.MountPath == "/etc/ssl/corp" }) {
		t.Errorf("volumes %+v, mounts %+v: want corp-ca mounted at /etc/ssl/corp", pod.Volumes, c.VolumeMounts)
	}
}

// TestSigningFailsClosed (issue 23): the chart signs by default; with no key and no explicit
// signing.enabled=false it refuses to install, saying how to make one.
func TestSigningFailsClosed(t *testing.T) {
	err := installValues(t, map[string]any{})
	if err == nil {
		t.Fatal("helm install with the default values succeeded; want it refused: signing is on and no key is given")
	}
	for _, want := range []string{"submit keygen", "kubectl", "signing.existingSecret", "signing.enabled=false"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	r := render(t, values(t, "signing: {privateKey: "+testPrivateKey+"}"))
	s := one[*corev1.Secret](t, r, fullname+"-signing")
	if string(s.Data["signing.key"]) != testPrivateKeyPEM {
		t.Errorf("the chart's signing Secret holds %q, want the key from the values", s.Data["signing.key"])
	}
}

// TestSecretsNeverInConfigMaps (issue 23): with every secret the chart takes set, no ConfigMap,
// no literal env value, no annotation and not NOTES.txt holds one; the scan finds the key
// where it belongs, in the Secret, so it would find it elsewhere.
func TestSecretsNeverInConfigMaps(t *testing.T) {
	r := render(t, values(t, `
signing: {privateKey: `+testPrivateKey+`}
natsServer: {credentialsSecret: {name: boxcar-nats}, operatorCredentialsSecret: {name: boxcar-nats-operator}}
metrics: {prometheusRule: {enabled: true}}
grafana: {dashboard: {enabled: true}}
keda: {enabled: true}
`))
	// The PEM's body, which is what a leak would show even if re-wrapped.
	secrets := []string{strings.Join(strings.Split(testPrivateKeyPEM, "\n")[1:2], "")}
	inSecret := 0
	for _, o := range r.objects {
		doc, err := yaml.Marshal(o.Obj)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range secrets {
			switch {
			case o.GVK.Kind == "Secret":
				if strings.Contains(string(o.Obj.(*corev1.Secret).Data["signing.key"]), s) {
					inSecret++
				}
			case strings.Contains(string(doc), s):
				t.Errorf("%s %s (%s) holds a secret value", o.GVK.Kind, o.Name, o.Template)
			}
		}
	}
	for _, s := range secrets {
		if strings.Contains(r.notes, s) {
			t.Error("NOTES.txt holds a secret value")
		}
	}
	if inSecret != len(secrets) {
		t.Fatalf("found %d of %d secrets in the Secret: the scan does not see them", inSecret, len(secrets))
	}
}

// checkNATSCredentials: with natsServer.credentialsSecret, --nats-creds names a file in a
// mounted volume of that Secret; without it, nothing names one (neither the flag nor NATS_CREDS).
func checkNATSCredentials(t *testing.T, r *rendered, flags map[string]string, env map[string]corev1.EnvVar, mounts map[string]corev1.Volume) {
	t.Helper()
	name, _ := lookup(r.values, "natsServer.credentialsSecret.name").(string)
	file, ok := flags["nats-creds"]
	if e, set := env["NATS_CREDS"]; set {
		t.Errorf("NATS_CREDS=%q: the chart gives the creds file as --nats-creds", e.Value)
	}
	if name == "" {
		if ok {
			t.Errorf("--nats-creds=%q without natsServer.credentialsSecret", file)
		}
		return
	}
	key, _ := lookup(r.values, "natsServer.credentialsSecret.key").(string)
	v := mounts[path.Dir(file)]
	if !ok || v.Secret == nil || v.Secret.SecretName != name ||
		len(v.Secret.Items) != 1 || v.Secret.Items[0].Key != key || v.Secret.Items[0].Path != path.Base(file) {
		t.Errorf("--nats-creds=%q in volume %+v, want a file of key %s of Secret %s", file, v, key, name)
	}
	if m := v.Secret.DefaultMode; m == nil || *m&0o007 != 0 {
		t.Errorf("NATS credentials mode %v, want none for others", m)
	}
}

// checkNATSTLS: with natsServer.tlsSecret, --nats-ca (and, with a certKey, --nats-cert and
// --nats-key) name files of a mounted volume of that Secret, each from its key; without it no
// flag names one.
func checkNATSTLS(t *testing.T, r *rendered, flags map[string]string, mounts map[string]corev1.Volume) {
	t.Helper()
	name, _ := lookup(r.values, "natsServer.tlsSecret.name").(string)
	certKey, _ := lookup(r.values, "natsServer.tlsSecret.certKey").(string)
	want := map[string]string{}
	if name != "" {
		want["nats-ca"], _ = lookup(r.values, "natsServer.tlsSecret.caKey").(string)
		if certKey != "" {
			want["nats-cert"] = certKey
			want["nats-key"], _ = lookup(r.values, "natsServer.tlsSecret.keyKey").(string)
		}
	}
	for _, flag := range []string{"nats-ca", "nats-cert", "nats-key"} {
		file, ok := flags[flag]
		key, wanted := want[flag]
		if ok != wanted {
			t.Errorf("--%s=%q given %v, want given %v (natsServer.tlsSecret %q, certKey %q)", flag, file, ok, wanted, name, certKey)
			continue
		}
		if !ok {
			continue
		}
		v := mounts[path.Dir(file)]
		if v.Secret == nil || v.Secret.SecretName != name || !slices.ContainsFunc(v.Secret.Items, func(i corev1.KeyToPath) bool {
			return i.Key == key && i.Path == path.Base(file)
		}) {
			t.Errorf("--%s=%q is not key %s of Secret %s: volume %+v", flag, file, key, name, v)
		}
		if m := v.Secret.DefaultMode; m == nil || *m&0o007 != 0 {
			t.Errorf("NATS TLS files mode %v, want none for others", m)
		}
	}
}

// checkWorkerNetworkPolicy: the workers' NetworkPolicy selects the worker pods, lets in only
// their metrics port, and lets out what the worker's config needs: DNS, NATS, the store, the
// model and the API server, on their ports.
func checkWorkerNetworkPolicy(t *testing.T, r *rendered, cfg config.Config) {
	t.Helper()
	var np *networkingv1.NetworkPolicy
	for _, p := range all[*networkingv1.NetworkPolicy](r) {
		if p.Namespace == releaseNamespace && p.Name == fullname+"-worker" {
			np = p
		}
	}
	if on, _ := lookup(r.values, "networkPolicy.enabled").(bool); !on {
		if np != nil {
			t.Errorf("NetworkPolicy %s with networkPolicy.enabled false", np.Name)
		}
		return
	}
	if np == nil {
		t.Fatal("no NetworkPolicy for the workers")
	}
	d := one[*appsv1.Deployment](t, r, fullname)
	if sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector); err != nil || sel.Empty() || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("worker NetworkPolicy selector %v does not select the worker pods %v", np.Spec.PodSelector, d.Spec.Template.Labels)
	}
	if len(np.Spec.PolicyTypes) != 2 || len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].Ports) != 1 || np.Spec.Ingress[0].Ports[0].Port.String() != metricsPort(t, cfg) {
		t.Errorf("worker NetworkPolicy types %v, ingress %+v; want both types and only the metrics port %s in", np.Spec.PolicyTypes, np.Spec.Ingress, metricsPort(t, cfg))
	}
	allowed := map[string]bool{}
	for _, rule := range np.Spec.Egress {
		if len(rule.Ports) == 0 {
			allowed["any"] = true
		}
		for _, p := range rule.Ports {
			port := "any" // every port of the protocol
			if p.Port != nil {
				port = p.Port.String()
			}
			allowed[string(*p.Protocol)+"/"+port] = true
		}
	}
	// The worker's model endpoint: model.base_url when the config names one, which the worker
	// takes over OPENAI_BASE_URL (openai.baseURL), else that.
	model := cfg.Model.BaseURL
	if model == "" {
		model, _ = lookup(r.values, "openai.baseURL").(string)
	}
	store := cfg.Store.Endpoint
	if store == "" {
		store = "https://s3.amazonaws.com"
	}
	need := map[string]string{
		"DNS": "UDP/53", "NATS": "TCP/" + urlPort(t, cfg.NATS.URL), "the store": "TCP/" + urlPort(t, store),
		"the model": "TCP/" + urlPort(t, model), "the API server": "TCP/443",
	}
	for what, port := range sandboxEgress(cfg) {
		need[what] = port
	}
	for what, port := range need {
		if !allowed[port] && !allowed["any"] {
			t.Errorf("the workers cannot reach %s on %s: egress %v", what, port, allowed)
		}
	}
}

// sandboxEgress is what the workers' egress proxy dials for sandboxes: each profile's
// network.allow entry on its TCP port ("TCP/any" for an entry that names none), and the proxy's
// egress.resolver.
func sandboxEgress(cfg config.Config) map[string]string {
	need := map[string]string{}
	for name, p := range cfg.Profiles {
		if p.Network == nil {
			continue
		}
		for _, entry := range p.Network.Allow {
			port := "TCP/any"
			if i := strings.LastIndexByte(entry, ':'); i >= 0 {
				port = "TCP/" + entry[i+1:]
			}
			need["profile "+name+"'s "+entry] = port
		}
	}
	if r := cfg.Egress.Resolver; r != "" {
		_, port, _ := strings.Cut(r, ":")
		need["the egress resolver"] = "UDP/" + port
	}
	return need
}

func metricsPort(t *testing.T, cfg config.Config) string {
	t.Helper()
	_, port, ok := strings.Cut(cfg.MetricsAddr, ":")
	if !ok {
		t.Fatalf("metrics_addr %q", cfg.MetricsAddr)
	}
	return port
}

// urlPort is a URL's port, or its scheme's.
func urlPort(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("%q: %v", raw, err)
	}
	if p := u.Port(); p != "" {
		return p
	}
	return map[string]string{"http": "80", "https": "443", "nats": "4222", "tls": "4222"}[u.Scheme]
}

// TestWorkerNetworkPolicyFollowsEndpoints: the egress ports move with the endpoints the config
// names (checkWorkerNetworkPolicy reads them from the worker's own config).
func TestWorkerNetworkPolicyFollowsEndpoints(t *testing.T) {
	for _, vals := range []string{
		"",
		"config: {store: {endpoint: 'http://versitygw.boxcar.svc:7070'}, nats: {url: 'nats://queue.msg:14222'}}\nopenai: {baseURL: 'http://model.boxcar.svc:8080/v1'}",
		"natsServer: {port: 4333}\nopenai: {baseURL: 'https://llm.corp.example/v1'}",
		"config: {model: {base_url: 'http://vllm.models.svc:8000/v1'}}",
		networkedProfile("['api.example.com:8443', '*.files.example.com:8080']") + "\n  egress: {resolver: 'dns.corp.example:5353'}",
		networkedProfile("['api.example.com', 'pypi.org:443']"),
	} {
		r := render(t, values(t, vals))
		checkWorkerNetworkPolicy(t, r, workerConfig(t, r))
	}
}

// networkedProfile is config values with a profile web whose sandboxes may reach allow.
func networkedProfile(allow string) string {
	return `config:
  profiles:
    web:
      model: {name: gpt-4.1-mini}
      sandbox: {image: busybox:1.37}
      tools: [{name: read_file}]
      network: {allow: ` + allow + `}`
}

// TestReleasesReapOnlyTheirOwn (issue 23): two releases share a sandbox namespace (same release
// name, two namespaces), each with its own queue. Each release's workers, configured as the
// chart configures them, reap only their own release's orphaned sandbox pods. A release whose
// <namespace>.<release> passes 63 characters still gets a label value of its own.
func TestReleasesReapOnlyTheirOwn(t *testing.T) {
	long := strings.Repeat("n", 63)
	releases := []string{"boxcar", "team-b", long}
	client := fake.NewClientset()
	const sandboxes = "shared-sandboxes"
	fakeKubelet(t, client, sandboxes)
	providers := map[string]*sandbox.KubernetesProvider{}
	instances := map[string]bool{}
	pods := map[string]string{} // pod -> the release namespace that started it
	for _, ns := range releases {
		r, err := tryRenderRelease(t, releaseName, ns, withSigningKey(values(t, "sandboxes: {namespace: "+sandboxes+"}")))
		if err != nil {
			t.Fatal(err)
		}
		k := workerConfig(t, r).Sandbox.Kubernetes
		if k.Instance == "" || instances[k.Instance] {
			t.Fatalf("release in %s: instance %q, want one of its own", ns, k.Instance)
		}
		instances[k.Instance] = true
		p, err := sandbox.NewKubernetes(sandbox.KubernetesConfig{
			Client: client, Executor: noExec{}, Namespace: k.Namespace, Instance: k.Instance,
			Image: "busybox:1.37", StartTimeout: 20 * time.Second,
		})
		if err != nil {
			t.Fatalf("release in %s: the backend refuses the chart's config: %v", ns, err)
		}
		providers[ns] = p
		spec := config.Profile{}.WithDefaults().Sandbox
		sb, err := p.Start(t.Context(), sandbox.Spec{JobID: "job-" + ns[:6], SandboxSpec: spec})
		if err != nil {
			t.Fatal(err)
		}
		pods[sb.Info().ID] = ns
	}
	reaped := map[string]bool{}
	for _, ns := range releases {
		// This release's queue holds no job: every pod it can see is an orphan to it.
		if n, err := providers[ns].Reap(t.Context(), func(sandbox.PodJob) bool { return false }, 0); err != nil || n != 1 {
			t.Fatalf("release in %s: Reap = %d, %v; want its own pod alone removed", ns, n, err)
		}
		reaped[ns] = true
		for name, owner := range pods {
			_, err := client.CoreV1().Pods(sandboxes).Get(t.Context(), name, metav1.GetOptions{})
			if gone := err != nil; gone != reaped[owner] {
				t.Errorf("after the release in %s reaped: pod %s of the release in %s gone = %v (%v)", ns, name, owner, gone, err)
			}
		}
	}
}

// TestReleasesSharingASandboxNamespaceNameTheirObjectsApart: releases may share a sandbox
// namespace (TestReleasesReapOnlyTheirOwn), two of them with the same release name in two
// namespaces too. Each object a release puts there (the pods' owner ConfigMap, the Role, the
// RoleBinding, the deny-all NetworkPolicy, the ResourceQuota) has a name of its own: with one
// name, Helm refuses the second install, or, adopted, the first release's uninstall deletes the
// second's owner ConfigMap and with it, through the garbage collector, all its sandbox pods.
// The Namespace itself is made by one release alone (sandboxes.createNamespace).
func TestReleasesSharingASandboxNamespaceNameTheirObjectsApart(t *testing.T) {
	t.Parallel()
	const shared = "shared-sandboxes"
	seen := map[string]string{} // kind namespace/name -> the release namespace that renders it
	for i, ns := range []string{"team-a", "team-b"} {
		create := strconv.FormatBool(i == 0)
		r, err := tryRenderRelease(t, releaseName, ns, withSigningKey(values(t, "sandboxes: {namespace: "+shared+", createNamespace: "+create+"}")))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range r.objects {
			m, ok := o.Obj.(interface{ GetNamespace() string })
			if !ok || m.GetNamespace() != shared {
				continue
			}
			key := o.GVK.Kind + " " + shared + "/" + o.Name
			if other, dup := seen[key]; dup {
				t.Errorf("%s is rendered by the release in %s and by the one in %s: the two releases cannot both own it", key, other, ns)
			}
			seen[key] = ns
		}
		if owner := workerConfig(t, r).Sandbox.Kubernetes.Owner; seen["ConfigMap "+shared+"/"+owner] != ns {
			t.Errorf("release in %s: its workers' owner %q is not the ConfigMap it renders", ns, owner)
		}
	}
}

// TestModelDownAlertShowsNoCredentials: an openai.baseURL with a user and password (a proxy's
// basic auth) or a key in its query would be quoted by the worker's pod spec and by the
// BoxcarModelDown alert, which goes to Alertmanager and whoever it pages: the chart refuses it
// (TestInstallRefusesBadValues has the other values of its kind), and the alert names the
// endpoint the chart takes, by scheme, host and path.
func TestModelDownAlertShowsNoCredentials(t *testing.T) {
	const leaky = "https://boxcar:pr0xy-pa55@model.example.com:8443/v1?api-key=k3y-in-query"
	_, err := tryRender(t, values(t, "signing: {privateKey: "+testPrivateKey+"}\nopenai: {baseURL: \""+leaky+"\"}\nmetrics: {prometheusRule: {enabled: true}}\n"))
	if err == nil || !strings.Contains(err.Error(), "openai.baseURL") {
		t.Fatalf("render with a password and a key in openai.baseURL: %v; want it refused naming openai.baseURL", err)
	}
	for _, secret := range []string{"pr0xy-pa55", "k3y-in-query"} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("the refusal holds %q of openai.baseURL: %v", secret, err)
		}
	}
	// The endpoint the workers use: openai.baseURL, or config.model.base_url, which they take
	// over it.
	for vals, want := range map[string]string{
		`openai: {baseURL: "https://model.example.com:8443/v1"}`:                                            "https://model.example.com:8443/v1",
		`config: {model: {base_url: "http://vllm.models.svc:8000/v1"}}`:                                     "http://vllm.models.svc:8000/v1",
		"openai: {baseURL: \"https://a.example/v1\"}\nconfig: {model: {base_url: \"http://b.example/v1\"}}": "http://b.example/v1",
	} {
		checkModelDownNames(t, render(t, values(t, vals+"\nmetrics: {prometheusRule: {enabled: true}}\n")), want)
	}
}

// checkModelDownNames: the PrometheusRule names the model endpoint want.
func checkModelDownNames(t *testing.T, r *rendered, want string) {
	t.Helper()
	found := false
	for _, o := range r.objects {
		if o.GVK.Kind != "PrometheusRule" {
			continue
		}
		found = true
		doc, err := yaml.Marshal(o.Obj)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(doc), want) {
			t.Errorf("the PrometheusRule %s does not name the model endpoint %s", o.Name, want)
		}
	}
	if !found {
		t.Fatal("no PrometheusRule rendered")
	}
}

// TestSandboxEgressLeavesOutWhatTheProxyNeverDials: the workers' NetworkPolicy rule for the
// sandboxes' destinations, by default (networkPolicy.sandboxEgress.to empty), lets the worker
// pods reach no address the egress proxy refuses whatever egress.allowed_cidrs lifts: cloud
// metadata (169.254.169.254 and the others of docs/egress.md's table), link-local, loopback,
// multicast. It let them reach every address: with a profile allowing a host on port 80, or
// one naming no port, the rule opened 169.254.169.254:80 to the pods that hold the model's key
// and the store's, which the proxy never dials for a sandbox. The resolver keeps its rule.
func TestSandboxEgressLeavesOutWhatTheProxyNeverDials(t *testing.T) {
	for _, allow := range []string{"['files.example.com:80']", "['api.example.com']"} {
		vals := networkedProfile(allow) + "\n  egress: {resolver: '169.254.20.10:53'}"
		np := workerPolicy(t, render(t, values(t, vals)))
		for _, dst := range []string{"169.254.169.254", "169.254.1.1", "127.0.0.1", "100.100.100.200", "168.63.129.16", "224.0.0.251", "fd00:ec2::254", "fe80::1",
			"64:ff9b::a9fe:a9fe", "64:ff9b::6464:64c8", "64:ff9b::a83f:8110", "64:ff9b::7f00:1", "64:ff9b::a9fe:101"} {
			if egressAllows(t, np, dst, corev1.ProtocolTCP, 80) {
				t.Errorf("network.allow %s: the workers' NetworkPolicy lets them reach %s on TCP/80", allow, dst)
			}
		}
		for _, dst := range []string{"203.0.113.7", "10.1.2.3", "2001:db8::7", "64:ff9b::cb00:7107"} {
			if !egressAllows(t, np, dst, corev1.ProtocolTCP, 80) {
				t.Errorf("network.allow %s: the workers cannot reach %s on TCP/80, which the proxy may dial", allow, dst)
			}
		}
		if !egressAllows(t, np, "169.254.20.10", corev1.ProtocolUDP, 53) {
			t.Errorf("network.allow %s: the workers cannot reach their egress.resolver 169.254.20.10 on UDP/53", allow)
		}
	}
}

// workerPolicy is the workers' NetworkPolicy.
func workerPolicy(t *testing.T, r *rendered) *networkingv1.NetworkPolicy {
	t.Helper()
	for _, p := range all[*networkingv1.NetworkPolicy](r) {
		if p.Namespace == releaseNamespace && p.Name == fullname+"-worker" {
			return p
		}
	}
	t.Fatal("no NetworkPolicy for the workers")
	return nil
}

// egressAllows tells whether np lets its pods reach the address dst, outside the cluster's
// pods, on proto/port: a rule matches when one of its ports does (none: every port) and one
// of its peers does (none: every address); a pod or namespace selector matches no such address.
func egressAllows(t *testing.T, np *networkingv1.NetworkPolicy, dst string, proto corev1.Protocol, port int) bool {
	t.Helper()
	addr := netip.MustParseAddr(dst)
	for _, rule := range np.Spec.Egress {
		portOK := len(rule.Ports) == 0
		for _, p := range rule.Ports {
			pr := corev1.ProtocolTCP
			if p.Protocol != nil {
				pr = *p.Protocol
			}
			portOK = portOK || (pr == proto && (p.Port == nil || p.Port.IntValue() == port))
		}
		if portOK && peersAllow(t, rule.To, addr) {
			return true
		}
	}
	return false
}

func peersAllow(t *testing.T, peers []networkingv1.NetworkPolicyPeer, addr netip.Addr) bool {
	t.Helper()
	if len(peers) == 0 {
		return true
	}
	for _, p := range peers {
		if p.IPBlock == nil || !netip.MustParsePrefix(p.IPBlock.CIDR).Contains(addr) {
			continue
		}
		if !slices.ContainsFunc(p.IPBlock.Except, func(c string) bool { return netip.MustParsePrefix(c).Contains(addr) }) {
			return true
		}
	}
	return false
}
