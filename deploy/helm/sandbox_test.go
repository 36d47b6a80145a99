package helm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/streaming/pkg/httpstream/wsstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

func TestMain(m *testing.M) {
	// The WebSocket server logs every connection the client closes; that is how each exec ends.
	klog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// permission is one thing RBAC authorizes: a verb on a resource (with its subresource) in a
// namespace.
type permission struct {
	Namespace, Resource, Verb string
}

func (p permission) String() string { return p.Verb + " " + p.Resource + " in " + p.Namespace }

// backendRun is what the kubernetes sandbox backend did while it was driven through a
// sandbox's whole life: the permissions its API calls need, and the pods it created.
type backendRun struct {
	permissions map[permission]bool
	pods        []*corev1.Pod
}

// apiServer plays the API server's pods/exec endpoint: it speaks the WebSocket remotecommand
// protocol (v5.channel.k8s.io, as a real API server and kubelet do) and runs each command on
// this host, and it records every request so the test can see what the backend asked for.
type apiServer struct {
	mu       sync.Mutex
	requests []*http.Request
}

func (s *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests = append(s.requests, r.Clone(context.Background()))
	s.mu.Unlock()
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	// /api/v1/namespaces/NS/pods/NAME/exec
	if len(parts) != 7 || parts[4] != "pods" || parts[6] != "exec" || !wsstream.IsWebSocketRequest(r) {
		http.Error(w, "this test server only serves pods/exec over WebSocket", http.StatusNotFound)
		return
	}
	q := r.URL.Query()
	argv := q["command"]
	conn := wsstream.NewConn(map[string]wsstream.ChannelProtocolConfig{
		"v5.channel.k8s.io": {Binary: true, Channels: []wsstream.ChannelType{
			wsstream.ReadChannel, wsstream.WriteChannel, wsstream.WriteChannel, wsstream.WriteChannel, wsstream.IgnoreChannel,
		}},
	})
	conn.SetIdleTimeout(time.Minute)
	_, streams, err := conn.Open(w, r)
	if err != nil {
		return
	}
	defer conn.Close()
	status := metav1.Status{Status: metav1.StatusSuccess}
	if len(argv) == 0 {
		status = metav1.Status{Status: metav1.StatusFailure, Message: "no command"}
	} else {
		cmd := exec.CommandContext(r.Context(), argv[0], argv[1:]...)
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		cmd.Dir = "/"
		if q.Get("stdin") == "true" {
			cmd.Stdin = streams[0]
		}
		cmd.Stdout, cmd.Stderr = streams[1], streams[2]
		cmd.WaitDelay = 200 * time.Millisecond
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			code := ee.ExitCode()
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				code = 128 + int(ws.Signal())
			}
			status = metav1.Status{
				Status: metav1.StatusFailure, Reason: "NonZeroExitCode",
				Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: "ExitCode", Message: strconv.Itoa(code)}}},
			}
		case err != nil:
			status = metav1.Status{Status: metav1.StatusFailure, Message: err.Error()}
		}
	}
	data, _ := json.Marshal(status)
	_, _ = streams[3].Write(data)
}

// permissions maps the recorded HTTP requests to what the API server authorizes them as: a
// connect request is "get" for GET and "create" for POST; since Kubernetes 1.35 (KEP-4006, the
// AuthorizePodWebsocketUpgradeCreatePermission gate, on by default) a WebSocket upgrade of
// pods/exec, attach or portforward must also be allowed "create".
func (s *apiServer) permissions(t *testing.T) []permission {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []permission
	for _, r := range s.requests {
		parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		if len(parts) != 7 || parts[0] != "api" || parts[2] != "namespaces" {
			t.Errorf("unexpected request %s %s", r.Method, r.URL.Path)
			continue
		}
		p := permission{Namespace: parts[3], Resource: parts[4] + "/" + parts[6]}
		switch r.Method {
		case http.MethodGet:
			out = append(out, permission{p.Namespace, p.Resource, "get"})
			if wsstream.IsWebSocketRequest(r) && slices.Contains([]string{"exec", "attach", "portforward"}, parts[6]) {
				out = append(out, permission{p.Namespace, p.Resource, "create"})
			}
		case http.MethodPost:
			out = append(out, permission{p.Namespace, p.Resource, "create"})
		default:
			t.Errorf("unexpected request %s %s", r.Method, r.URL.Path)
		}
	}
	return out
}

// client is the fake clientset for the typed API, which records every call as an action,
// with a real REST client for pods/exec, which streams and so goes over HTTP. Whether the
// backend builds its exec requests from Client.CoreV1().RESTClient() or from RESTConfig, they
// reach the apiServer.
type client struct {
	*fake.Clientset
	rest rest.Interface
}

func (c client) CoreV1() typedcorev1.CoreV1Interface { return coreV1{c.Clientset.CoreV1(), c.rest} }

type coreV1 struct {
	typedcorev1.CoreV1Interface
	rest rest.Interface
}

func (c coreV1) RESTClient() rest.Interface { return c.rest }

var _ kubernetes.Interface = client{}

// fakeKubelet marks each new pod Running, through the tracker so that it records no action of
// its own: only the backend's calls are recorded.
func fakeKubelet(t *testing.T, cs *fake.Clientset, namespace string) {
	t.Helper()
	gvr := corev1.SchemeGroupVersion.WithResource("pods")
	w, err := cs.Tracker().Watch(gvr, namespace)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { w.Stop(); <-done })
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type != watch.Added {
				continue
			}
			pod = pod.DeepCopy()
			pod.Status = corev1.PodStatus{
				Phase: corev1.PodRunning,
				ContainerStatuses: []corev1.ContainerStatus{{
					Name: pod.Spec.Containers[0].Name, Ready: true,
					State:   corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
					ImageID: "docker.io/library/busybox@sha256:0123456789abcdef",
				}},
			}
			if err := cs.Tracker().Update(gvr, pod, namespace); err != nil {
				t.Errorf("fake kubelet: %v", err)
			}
		}
	}()
}

// driveBackend runs the kubernetes sandbox backend through everything a worker does with it:
// start, commands (with a timeout that kills), file transfers, close, a second close, and the
// reaper deleting a pod whose job is gone. It returns the permissions all that needed.
func driveBackend(t *testing.T, k config.Kubernetes) backendRun {
	t.Helper()
	namespace := k.Namespace
	api := &apiServer{}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	restConfig := &rest.Config{Host: srv.URL}
	real, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		t.Fatal(err)
	}
	// The pods' owner, as the chart makes it; the API server gives it its uid.
	cs := fake.NewClientset(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: k.Owner, Namespace: namespace, UID: ownerUID}})
	fakeKubelet(t, cs, namespace)
	// The fake clientset cannot store access reviews; the real API server answers them from
	// RBAC, and the chart's Role grants everything, so the fake answers "allowed".
	cs.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview).DeepCopy()
		r.Status.Allowed = true
		return true, r, nil
	})
	p, err := sandbox.NewKubernetes(sandbox.KubernetesConfig{
		Client: client{Clientset: cs, rest: real.CoreV1().RESTClient()}, RESTConfig: restConfig,
		Namespace: namespace, Instance: k.Instance, Owner: k.Owner, Image: "busybox:1.37", WorkerID: "worker-0", StartTimeout: 20 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if c, ok := any(p).(interface{ Check(context.Context) error }); ok {
		if err := c.Check(ctx); err != nil {
			t.Fatalf("Check: %v", err)
		}
	}
	start := func(job string) sandbox.Sandbox {
		t.Helper()
		// The commands run on this host: the workdir is a host folder.
		spec := config.Profile{}.WithDefaults().Sandbox
		spec.Workdir = t.TempDir()
		sb, err := p.Start(ctx, sandbox.Spec{JobID: job, SandboxSpec: spec})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		return sb
	}
	sb := start("job-1")
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "cat; echo err >&2; exit 3"}, Stdin: []byte("in\n")})
	if err != nil || res.ExitCode != 3 || string(res.Stdout) != "in\n" || string(res.Stderr) != "err\n" {
		t.Fatalf("Exec = %+v (stdout %q, stderr %q), %v; want exit 3 with the streams apart", res, res.Stdout, res.Stderr, err)
	}
	res, err = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "30"}, Timeout: 200 * time.Millisecond})
	if err != nil || !res.TimedOut {
		t.Fatalf("Exec with a timeout = %+v, %v; want timed out", res, err)
	}
	if err := sb.WriteFile(ctx, "out/report.md", []byte("# done\n")); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if data, err := sb.ReadFile(ctx, "out/report.md", 1<<10); err != nil || string(data) != "# done\n" {
		t.Fatalf("ReadFile = %q, %v", data, err)
	}
	if files, err := sb.List(ctx, "out"); err != nil || len(files) != 1 {
		t.Fatalf("List = %v, %v", files, err)
	}
	if err := sb.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := sb.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	// A warm pod, started ahead of its job and claimed by it.
	spec := config.Profile{}.WithDefaults().Sandbox
	spec.Workdir = t.TempDir()
	warm, err := p.Start(ctx, sandbox.Spec{Pool: "p", Ahead: time.Minute, SandboxSpec: spec})
	if err != nil {
		t.Fatalf("Start a warm pod: %v", err)
	}
	if err := warm.(sandbox.Claimer).Claim(ctx, "default", "job-3"); err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if err := warm.Close(ctx); err != nil {
		t.Fatalf("Close the claimed pod: %v", err)
	}

	start("job-2") // its worker "crashes": only the reaper removes it
	held := func(sandbox.PodJob) bool { return false }
	if n, err := p.Reap(ctx, held, 0); err != nil || n != 1 {
		t.Fatalf("Reap = %d, %v; want the orphaned pod deleted", n, err)
	}

	run := backendRun{permissions: map[permission]bool{}}
	for _, a := range cs.Actions() {
		if a.GetResource().Resource == "selfsubjectaccessreviews" {
			continue // every authenticated user may ask what it may do (system:basic-user); no Role needed
		}
		resource := a.GetResource().Resource
		if sub := a.GetSubresource(); sub != "" {
			resource += "/" + sub
		}
		if a.GetResource().Group != "" {
			t.Errorf("unexpected API group %s in %s", a.GetResource().Group, a.GetVerb())
		}
		run.permissions[permission{Namespace: a.GetNamespace(), Resource: resource, Verb: rbacVerb(a.GetVerb())}] = true
		if c, ok := a.(k8stesting.CreateAction); ok {
			if pod, ok := c.GetObject().(*corev1.Pod); ok {
				run.pods = append(run.pods, pod)
			}
		}
	}
	for _, perm := range api.permissions(t) {
		run.permissions[perm] = true
	}
	if len(run.pods) != 3 {
		t.Fatalf("backend created %d pods, want 3 (two for jobs, one warm)", len(run.pods))
	}
	return run
}

// ownerUID is the uid driveBackend's API server gives the pods' owner.
const ownerUID = "0c4f3d1e-owner"

// TestSandboxPodsOwnedByTheRelease: every sandbox pod, warm or a job's, is owned by a
// ConfigMap of the release in the sandbox namespace, which `helm uninstall` deletes (no
// resource-policy keep), so the garbage collector removes the pods the workers can no longer
// remove: their ServiceAccount and Role go with them.
func TestSandboxPodsOwnedByTheRelease(t *testing.T) {
	r := render(t, nil)
	cfg := workerConfig(t, r)
	k := cfg.Sandbox.Kubernetes
	owner := one[*corev1.ConfigMap](t, r, k.Owner)
	if owner.Namespace != k.Namespace || owner.Annotations["helm.sh/resource-policy"] != "" {
		t.Errorf("owner ConfigMap %s in %q with annotations %v; want it in the sandbox namespace %s, deleted with the release", owner.Name, owner.Namespace, owner.Annotations, k.Namespace)
	}
	want := metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: ownerUID}
	for _, pod := range driveBackend(t, k).pods {
		if len(pod.OwnerReferences) != 1 || pod.OwnerReferences[0] != want {
			t.Errorf("sandbox pod %s owners %+v, want only %+v", pod.Name, pod.OwnerReferences, want)
		}
	}
}

// noExec is a PodExecutor for tests that run no command.
type noExec struct{}

func (noExec) Exec(context.Context, string, string, []string, io.Reader, io.Writer, io.Writer) error {
	return errors.New("this test runs no command")
}

// rbacVerb turns a fake clientset action verb into the RBAC verb that authorizes it.
func rbacVerb(v string) string {
	if v == "delete-collection" {
		return "deletecollection"
	}
	return v
}

// TestRoleMatchesBackend: the chart's Role grants exactly what the kubernetes sandbox backend
// needs, as found by driving the backend, not from a copied list. A call the backend adds
// without the chart fails here; so does a verb the chart grants that the backend never uses.
func TestRoleMatchesBackend(t *testing.T) {
	r := render(t, nil)
	cfg := workerConfig(t, r)
	run := driveBackend(t, cfg.Sandbox.Kubernetes)

	role := one[*rbacv1.Role](t, r, "")
	granted := map[permission]bool{}
	for _, rule := range role.Rules {
		if len(rule.ResourceNames) > 0 || len(rule.NonResourceURLs) > 0 {
			t.Errorf("rule %+v: the backend names pods it creates itself; grant by resource", rule)
		}
		for _, g := range rule.APIGroups {
			if g != "" {
				t.Errorf("rule grants API group %q; the backend uses only the core group", g)
			}
		}
		for _, res := range rule.Resources {
			for _, v := range rule.Verbs {
				if v == "*" || res == "*" {
					t.Errorf("rule %+v uses a wildcard", rule)
				}
				granted[permission{Namespace: role.Namespace, Resource: res, Verb: v}] = true
			}
		}
	}
	for p := range run.permissions {
		if !granted[p] {
			t.Errorf("the backend needs %s; the Role does not grant it", p)
		}
	}
	for p := range granted {
		if !run.permissions[p] {
			t.Errorf("the Role grants %s; the backend never uses it", p)
		}
	}
	if t.Failed() {
		t.Logf("the backend needs: %v", sortedPermissions(run.permissions))
	}
}

func sortedPermissions(m map[permission]bool) []string {
	var out []string
	for p := range m {
		out = append(out, p.String())
	}
	slices.Sort(out)
	return out
}

// TestNetworkPolicySelectsSandboxPods: the deny-all policy selects every pod the backend
// creates.
func TestNetworkPolicySelectsSandboxPods(t *testing.T) {
	r := render(t, nil)
	cfg := workerConfig(t, r)
	run := driveBackend(t, cfg.Sandbox.Kubernetes)
	np := slices.DeleteFunc(all[*networkingv1.NetworkPolicy](r), func(p *networkingv1.NetworkPolicy) bool {
		return p.Namespace != cfg.Sandbox.Kubernetes.Namespace
	})
	if len(np) != 1 {
		t.Fatalf("%d NetworkPolicies in the sandbox namespace, want 1", len(np))
	}
	sel, err := metav1.LabelSelectorAsSelector(&np[0].Spec.PodSelector)
	if err != nil {
		t.Fatal(err)
	}
	for _, pod := range run.pods {
		if pod.Namespace != "" && pod.Namespace != np[0].Namespace {
			t.Errorf("sandbox pod %s in %s, the policy in %s", pod.Name, pod.Namespace, np[0].Namespace)
		}
		if !sel.Matches(labels.Set(pod.Labels)) {
			t.Errorf("NetworkPolicy %s (selector %s) does not select sandbox pod %s with labels %v", np[0].Name, sel, pod.Name, pod.Labels)
		}
	}
}

// startFromChart is startSpecFromChart for a profile of the default sandbox spec.
func startFromChart(t *testing.T, r *rendered) (*corev1.Pod, sandbox.Info) {
	t.Helper()
	return startSpecFromChart(t, r, config.Profile{}.WithDefaults().Sandbox)
}

// startSpecFromChart starts a sandbox pod for a job of a profile with spec as a worker of
// release r would: the backend configured from the chart's worker config as the worker
// configures it (sandbox.KubernetesConfigFor).
func startSpecFromChart(t *testing.T, r *rendered, spec config.SandboxSpec) (*corev1.Pod, sandbox.Info) {
	t.Helper()
	k := workerConfig(t, r).Sandbox.Kubernetes
	cs := fake.NewClientset(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: k.Owner, Namespace: k.Namespace, UID: ownerUID}})
	fakeKubelet(t, cs, k.Namespace)
	cfg := sandbox.KubernetesConfigFor(k)
	cfg.Client, cfg.Executor, cfg.Image, cfg.WorkerID, cfg.StartTimeout = cs, noExec{}, "busybox:1.37", "worker-0", 20*time.Second
	p, err := sandbox.NewKubernetes(cfg)
	if err != nil {
		t.Fatalf("the backend refuses the chart's config: %v", err)
	}
	sb, err := p.Start(t.Context(), sandbox.Spec{JobID: "job-1", SandboxSpec: spec})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := cs.CoreV1().Pods(k.Namespace).Get(t.Context(), sb.Info().ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod, sb.Info()
}

// TestSandboxPodsPullWithTheReleasesSecrets: every sandbox pod's init container pulls the
// worker's own image (the egress bridge), in the sandbox namespace. With a private worker
// image, the release's imagePullSecrets must reach the sandbox pods as well as the workers,
// or every sandbox pod stays in ErrImagePull on a node that has not pulled the image yet. Only
// the names go into the worker config (the Secrets themselves must exist in the sandbox
// namespace, which NOTES.txt says); without imagePullSecrets the pods name none.
func TestSandboxPodsPullWithTheReleasesSecrets(t *testing.T) {
	t.Parallel()
	r := render(t, values(t, `
image: {repository: registry.private.example/boxcar, tag: "1.0.0"}
imagePullSecrets: [{name: regcred}, {name: mirror}]
`))
	d := one[*appsv1.Deployment](t, r, fullname)
	if !slices.ContainsFunc(d.Spec.Template.Spec.ImagePullSecrets, func(s corev1.LocalObjectReference) bool { return s.Name == "regcred" }) {
		t.Fatalf("the workers do not get the pull secret: %+v", d.Spec.Template.Spec.ImagePullSecrets)
	}
	pod, _ := startFromChart(t, r)
	if len(pod.Spec.InitContainers) != 1 || pod.Spec.InitContainers[0].Image != "registry.private.example/boxcar:1.0.0" {
		t.Fatalf("init containers %+v, want one of the worker's image", pod.Spec.InitContainers)
	}
	want := []corev1.LocalObjectReference{{Name: "regcred"}, {Name: "mirror"}}
	if !slices.Equal(pod.Spec.ImagePullSecrets, want) {
		t.Errorf("sandbox pod %s pulls the private worker image with pull secrets %v, want the release's %v", pod.Name, pod.Spec.ImagePullSecrets, want)
	}
	if !strings.Contains(r.notes, "regcred") || !strings.Contains(r.notes, "boxcar-sandboxes") {
		t.Errorf("NOTES.txt does not say that Secret regcred must exist in the sandbox namespace:\n%s", r.notes)
	}

	if pod, _ := startFromChart(t, render(t, nil)); len(pod.Spec.ImagePullSecrets) != 0 {
		t.Errorf("without imagePullSecrets, sandbox pods pull with %v", pod.Spec.ImagePullSecrets)
	}
}

// TestIsolationSaysWhetherTheChartMadeTheNetworkPolicy: a sandbox pod's isolation, which the
// runner signs into the manifest (sandbox.isolation), claims the deny-all NetworkPolicy only
// when the release made one (sandboxes.networkPolicy.enabled), and says the network is not
// isolated when it did not.
func TestIsolationSaysWhetherTheChartMadeTheNetworkPolicy(t *testing.T) {
	t.Parallel()
	for _, enabled := range []bool{true, false} {
		r := render(t, values(t, "sandboxes: {networkPolicy: {enabled: "+strconv.FormatBool(enabled)+"}}"))
		k := workerConfig(t, r).Sandbox.Kubernetes
		made := slices.ContainsFunc(all[*networkingv1.NetworkPolicy](r), func(np *networkingv1.NetworkPolicy) bool { return np.Namespace == k.Namespace })
		if made != enabled {
			t.Fatalf("networkPolicy.enabled=%v: a NetworkPolicy in the sandbox namespace: %v", enabled, made)
		}
		_, info := startFromChart(t, r)
		if claims := strings.Contains(info.Isolation, "deny-all NetworkPolicy"); claims != made {
			t.Errorf("networkPolicy.enabled=%v: isolation %q claims a deny-all NetworkPolicy: %v; the release made one: %v", enabled, info.Isolation, claims, made)
		}
		if !made && !strings.Contains(info.Isolation, "network=not isolated") {
			t.Errorf("networkPolicy.enabled=false: isolation %q does not say the network is not isolated", info.Isolation)
		}
	}
}

// TestClusterRoleGrantsTheNamespaceRead: a sandbox namespace deleted with the chart's Role in
// it leaves the workers refused everything there; the backend then reads the namespace to say
// it is gone, and the chart's ClusterRole grants each such call: get, on that namespace alone.
func TestClusterRoleGrantsTheNamespaceRead(t *testing.T) {
	r := render(t, nil)
	ns := workerConfig(t, r).Sandbox.Kubernetes.Namespace
	cs := fake.NewClientset()
	cs.PrependReactor("*", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("pods"), "", fmt.Errorf(`User "system:serviceaccount:boxcar:boxcar" cannot %s resource "pods" in API group "" in the namespace %q`, a.GetVerb(), ns))
	})
	cs.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, a.(k8stesting.CreateAction).GetObject(), nil // not allowed
	})
	p, err := sandbox.NewKubernetes(sandbox.KubernetesConfig{Client: cs, Executor: noExec{}, Namespace: ns, Image: "busybox:1.37", StartTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	spec := config.Profile{}.WithDefaults().Sandbox
	if _, err := p.Start(t.Context(), sandbox.Spec{JobID: "job-1", SandboxSpec: spec}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("Start: %v; want the namespace named gone", err)
	}
	if err := p.Check(t.Context()); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("Check: %v; want the namespace named gone", err)
	}
	cr := one[*rbacv1.ClusterRole](t, r, "")
	reads := 0
	for _, a := range cs.Actions() {
		if a.GetResource().Resource != "namespaces" {
			continue
		}
		reads++
		g, ok := a.(k8stesting.GetAction)
		if !ok || !slices.ContainsFunc(cr.Rules, func(rule rbacv1.PolicyRule) bool {
			return slices.Contains(rule.Resources, "namespaces") && slices.Contains(rule.Verbs, a.GetVerb()) && slices.Contains(rule.ResourceNames, g.GetName())
		}) {
			t.Errorf("the backend calls %s namespaces %v; the ClusterRole %+v does not grant it", a.GetVerb(), a, cr.Rules)
		}
	}
	if reads == 0 {
		t.Error("the backend never read the namespace")
	}
}
