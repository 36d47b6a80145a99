package sandbox_test

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

const testNamespace = "boxcar-sandboxes"

// noExec stands in for pods/exec in tests that only start and delete pods. Commands and file
// transfers go through the real client against a real server in kubernetes_exec_test.go.
type noExec struct{}

func (noExec) Exec(context.Context, string, string, []string, io.Reader, io.Writer, io.Writer) error {
	return errors.New("this test has no kubelet to exec in")
}

// fakeKubelet plays the kubelet against a fake clientset: each new sandbox pod gets the status
// that status returns for it (nil: running).
func fakeKubelet(t testing.TB, client *fake.Clientset, status func(*corev1.Pod) *corev1.PodStatus) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := client.CoreV1().Pods(testNamespace).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		w.Stop()
		<-done
	})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type != watch.Added {
				continue
			}
			st := running()
			if status != nil {
				if s := status(pod); s != nil {
					st = *s
				}
			}
			pod = pod.DeepCopy()
			pod.Status = st
			if _, err := client.CoreV1().Pods(testNamespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil {
				t.Errorf("fake kubelet: %v", err)
			}
		}
	}()
}

func running() corev1.PodStatus {
	return corev1.PodStatus{
		Phase: corev1.PodRunning,
		ContainerStatuses: []corev1.ContainerStatus{{
			Name:    "sandbox",
			State:   corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
			ImageID: "docker.io/library/busybox@sha256:0123456789abcdef",
		}},
	}
}

func waiting(reason string) corev1.PodStatus {
	return corev1.PodStatus{
		Phase: corev1.PodPending,
		ContainerStatuses: []corev1.ContainerStatus{{
			Name:  "sandbox",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "test says so"}},
		}},
	}
}

func newKubernetes(t testing.TB, client *fake.Clientset, edit ...func(*sandbox.KubernetesConfig)) *sandbox.KubernetesProvider {
	t.Helper()
	cfg := sandbox.KubernetesConfig{Client: client, Executor: noExec{}, Image: "busybox:1.37", StartTimeout: 10 * time.Second, WorkerID: "w1"}
	for _, e := range edit {
		e(&cfg)
	}
	p, err := sandbox.NewKubernetes(cfg)
	if err != nil {
		t.Fatalf("NewKubernetes: %v", err)
	}
	return p
}

func TestKubernetesPodSpec(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, nil)
	p := newKubernetes(t, client)
	sb := sandboxtest.StartSpec(t, p, config.SandboxSpec{Image: "registry.example/tools:1", CPU: "500m", Memory: "256Mi", Disk: "1Gi", RuntimeClass: "gvisor", Lifetime: config.Duration(20 * time.Minute)})

	pods, err := client.CoreV1().Pods(testNamespace).List(t.Context(), metav1.ListOptions{})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("want one pod, got %d (%v)", len(pods.Items), err)
	}
	pod := pods.Items[0]

	for _, refusal := range restrictedRefusals(t, &pod) {
		t.Errorf("Pod Security Standard restricted: %s", refusal)
	}

	spec, c := pod.Spec, pod.Spec.Containers[0]
	checks := []struct {
		name string
		ok   bool
	}{
		{"no service-account token", spec.AutomountServiceAccountToken != nil && !*spec.AutomountServiceAccountToken},
		{"no service links", spec.EnableServiceLinks != nil && !*spec.EnableServiceLinks},
		{"never restarts", spec.RestartPolicy == corev1.RestartPolicyNever},
		{"deadline from the lifetime", spec.ActiveDeadlineSeconds != nil && *spec.ActiveDeadlineSeconds == 1200},
		{"runtime class", spec.RuntimeClassName != nil && *spec.RuntimeClassName == "gvisor"},
		{"host namespaces off", !spec.HostNetwork && !spec.HostPID && !spec.HostIPC},
		{"read-only root", c.SecurityContext.ReadOnlyRootFilesystem != nil && *c.SecurityContext.ReadOnlyRootFilesystem},
		{"image", c.Image == "registry.example/tools:1"},
		{"requests equal limits", c.Resources.Requests.Cpu().Equal(*c.Resources.Limits.Cpu()) && c.Resources.Requests.Memory().Equal(*c.Resources.Limits.Memory())},
		{"cpu limit", c.Resources.Limits.Cpu().String() == "500m"},
		{"memory limit", c.Resources.Limits.Memory().String() == "256Mi"},
		{"ephemeral storage limit", !c.Resources.Limits.StorageEphemeral().IsZero()},
		{"no env from secrets", len(c.EnvFrom) == 0 && !strings.Contains(pod.String(), "secretKeyRef")},
		{"deny-all policy label", pod.Labels["app.kubernetes.io/component"] == "sandbox"},
		{"job label", pod.Labels["boxcar.run/job-id"] == "test-"+t.Name() && pod.Annotations["boxcar.run/job-id"] == "test-"+t.Name()},
		{"worker label", pod.Labels["boxcar.run/worker"] == "w1"},
		{"no pull secrets unless configured", len(spec.ImagePullSecrets) == 0},
	}
	for _, check := range checks {
		if !check.ok {
			t.Errorf("pod spec: %s does not hold", check.name)
		}
	}
	volumes := map[string]*corev1.EmptyDirVolumeSource{}
	for _, v := range spec.Volumes {
		if v.EmptyDir == nil {
			t.Errorf("volume %s is not an emptyDir", v.Name)
			continue
		}
		volumes[v.Name] = v.EmptyDir
	}
	if wd := volumes["workdir"]; wd == nil || wd.SizeLimit == nil || wd.SizeLimit.String() != "1Gi" {
		t.Errorf("workdir volume = %+v, want an emptyDir limited to 1Gi", wd)
	}
	if tmp := volumes["tmp"]; tmp == nil || tmp.SizeLimit == nil {
		t.Errorf("tmp volume = %+v, want a size-limited emptyDir", tmp)
	}
	info := sb.Info()
	if info.Backend != "kubernetes" || info.ID != pod.Name || info.ImageDigest != "sha256:0123456789abcdef" || !strings.Contains(info.Isolation, "pss=restricted") {
		t.Errorf("Info() = %+v", info)
	}
}

// TestKubernetesPodSpecAsDeployed: what the deployment says of the sandbox namespace reaches
// the pod and its isolation, which the manifest signs: the pull secrets (names of Secrets in
// that namespace), and whether a deny-all NetworkPolicy isolates it. The profile's pids is
// not claimed: no pod field bounds a pod's processes.
func TestKubernetesPodSpecAsDeployed(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		policy  string
		network string
	}{
		{policy: "", network: "; network=deny-all NetworkPolicy on app.kubernetes.io/component=sandbox"},
		{policy: "deny-all", network: "; network=deny-all NetworkPolicy"},
		{policy: "none", network: "; network=not isolated: no NetworkPolicy"},
	} {
		client := fake.NewClientset()
		fakeKubelet(t, client, nil)
		p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) {
			c.NetworkPolicy, c.ImagePullSecrets = tt.policy, []string{"regcred", "mirror"}
		})
		sb := sandboxtest.StartSpec(t, p, config.SandboxSpec{PIDs: 64})
		want := []corev1.LocalObjectReference{{Name: "regcred"}, {Name: "mirror"}}
		if got := getPod(t, client, sb.Info().ID).Spec.ImagePullSecrets; !slices.Equal(got, want) {
			t.Errorf("pull secrets %v, want %v", got, want)
		}
		info := sb.Info()
		if !strings.Contains(info.Isolation, tt.network) || strings.Count(info.Isolation, "network=") != 1 {
			t.Errorf("NetworkPolicy %q: isolation %q, want it to say %q", tt.policy, info.Isolation, tt.network)
		}
		if info.PIDs != 0 || !strings.Contains(info.Isolation, "pids=none per pod") {
			t.Errorf("pids %d, isolation %q: want no bound claimed for the profile's pids", info.PIDs, info.Isolation)
		}
		// The kernel's per-uid counters (message queues, pending signals, inotify, pipe pages)
		// are not the pod's own: every sandbox pod runs as the same uid on the node.
		if shared := "per_uid_limits=shared by the node's pods of uid 1000"; !strings.Contains(info.Isolation, shared) {
			t.Errorf("isolation %q: want it to say %q", info.Isolation, shared)
		}
	}
}

// restricted is the Pod Security Standard the sandbox pods meet, at the Kubernetes minor
// version of client-go and pod-security-admission (v0.37 → 1.37).
var restricted = psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.MajorMinorVersion(1, 37)}

// restrictedRefusals evaluates a pod against restricted and returns why it is refused, if it is.
func restrictedRefusals(t *testing.T, pod *corev1.Pod) []string {
	t.Helper()
	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var refusals []string
	for _, r := range eval.EvaluatePod(restricted, &pod.ObjectMeta, &pod.Spec) {
		if !r.Allowed {
			refusals = append(refusals, r.ForbiddenReason+" ("+r.ForbiddenDetail+")")
		}
	}
	return refusals
}

// TestKubernetesPodSpecRestrictedRefusesPrivileged shows that the evaluator the pod spec passes
// has teeth: the same pod, loosened in any one of the ways restricted forbids, is refused.
func TestKubernetesPodSpecRestrictedRefusesPrivileged(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, nil)
	sandboxtest.StartSpec(t, newKubernetes(t, client), config.SandboxSpec{})
	pods, err := client.CoreV1().Pods(testNamespace).List(t.Context(), metav1.ListOptions{})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("want one pod, got %d (%v)", len(pods.Items), err)
	}
	sandboxPod := pods.Items[0]
	if refusals := restrictedRefusals(t, &sandboxPod); len(refusals) > 0 {
		t.Fatalf("the sandbox pod itself is refused: %v", refusals)
	}
	yes, no, root := true, false, int64(0)
	tests := []struct {
		name   string
		loosen func(*corev1.Pod)
	}{
		{name: "privileged", loosen: func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.Privileged = &yes
			p.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = &yes
			p.Spec.Containers[0].SecurityContext.Capabilities = &corev1.Capabilities{Add: []corev1.Capability{"ALL"}}
			p.Spec.SecurityContext.RunAsNonRoot, p.Spec.Containers[0].SecurityContext.RunAsNonRoot = &no, &no
			p.Spec.SecurityContext.RunAsUser = &root
			p.Spec.HostNetwork, p.Spec.HostPID = true, true
		}},
		{name: "privileged container only", loosen: func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext.Privileged = &yes }},
		{name: "privilege escalation", loosen: func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = &yes }},
		{name: "a capability added", loosen: func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"SYS_ADMIN"}
		}},
		{name: "capabilities not dropped", loosen: func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext.Capabilities = nil }},
		{name: "runs as root", loosen: func(p *corev1.Pod) {
			p.Spec.SecurityContext.RunAsNonRoot, p.Spec.Containers[0].SecurityContext.RunAsNonRoot = nil, nil
			p.Spec.SecurityContext.RunAsUser = &root
		}},
		{name: "seccomp unconfined", loosen: func(p *corev1.Pod) {
			p.Spec.SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
			p.Spec.Containers[0].SecurityContext.SeccompProfile = nil
		}},
		{name: "host network", loosen: func(p *corev1.Pod) { p.Spec.HostNetwork = true }},
		{name: "host pid", loosen: func(p *corev1.Pod) { p.Spec.HostPID = true }},
		{name: "host path volume", loosen: func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		}},
		{name: "host port", loosen: func(p *corev1.Pod) {
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 80, HostPort: 80}}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := sandboxPod.DeepCopy()
			tt.loosen(pod)
			refusals := restrictedRefusals(t, pod)
			if len(refusals) == 0 {
				t.Errorf("restricted allows the loosened pod; the evaluator would not catch this in the sandbox spec")
			}
			t.Logf("refused: %v", refusals)
		})
	}
}

func TestKubernetesStartFailsFastAndDeletes(t *testing.T) {
	tests := []struct {
		name   string
		status corev1.PodStatus
		want   string
	}{
		{name: "image pull back-off", status: waiting("ImagePullBackOff"), want: "ImagePullBackOff"},
		{name: "image pull error", status: waiting("ErrImagePull"), want: "ErrImagePull"},
		{name: "bad config", status: waiting("CreateContainerConfigError"), want: "CreateContainerConfigError"},
		{name: "crash loop", status: waiting("CrashLoopBackOff"), want: "CrashLoopBackOff"},
		{name: "pod failed", status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "DeadlineExceeded"}, want: "DeadlineExceeded"},
		{name: "container exited", status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "sandbox", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 127, Reason: "Error"}},
		}}}, want: "code 127"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			fakeKubelet(t, client, func(*corev1.Pod) *corev1.PodStatus { return &tt.status })
			p := newKubernetes(t, client)
			start := time.Now()
			_, err := p.Start(t.Context(), sandboxtest.Spec("fail", config.SandboxSpec{}))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Start: err = %v, want one naming %s", err, tt.want)
			}
			if elapsed := time.Since(start); elapsed > 5*time.Second {
				t.Errorf("Start gave up after %v, want at once", elapsed)
			}
			expectNoPods(t, client)
		})
	}
}

// initContainer is the status of a pod whose egress-bridge init container is in state, its
// sandbox container waiting in PodInitializing meanwhile.
func initContainer(state corev1.ContainerState) corev1.PodStatus {
	return corev1.PodStatus{
		Phase: corev1.PodPending,
		Conditions: []corev1.PodCondition{{
			Type: corev1.PodInitialized, Status: corev1.ConditionFalse, Reason: "ContainersNotInitialized",
			Message: "containers with incomplete status: [egress-bridge]",
		}},
		InitContainerStatuses: []corev1.ContainerStatus{{Name: "egress-bridge", State: state}},
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: "sandbox", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}},
		}},
	}
}

// TestKubernetesStartFailsFastOnInitContainer: with a bridge image, every sandbox pod has the
// egress-bridge init container, which pulls the worker's own image. When it cannot start (a
// wrong tag, a private registry without a pull secret) or fails, the pod stays Pending for
// good: Start fails at once naming the init container and its reason, as for the sandbox
// container (TestKubernetesStartFailsFastAndDeletes), rather than wait out StartTimeout (5
// minutes by default, per job and per warm pod) and report ContainersNotInitialized.
func TestKubernetesStartFailsFastOnInitContainer(t *testing.T) {
	t.Parallel()
	waitingFor := func(reason string) corev1.ContainerState {
		return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "registry.example/boxcar:missing: not found"}}
	}
	for _, tt := range []struct {
		name  string
		state corev1.ContainerState
		want  string
	}{
		{name: "image pull error", state: waitingFor("ErrImagePull"), want: "init container egress-bridge cannot start: ErrImagePull"},
		{name: "image pull back-off", state: waitingFor("ImagePullBackOff"), want: "init container egress-bridge cannot start: ImagePullBackOff"},
		{name: "bad config", state: waitingFor("CreateContainerConfigError"), want: "init container egress-bridge cannot start: CreateContainerConfigError"},
		{name: "failed", state: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"}}, want: "init container egress-bridge exited (Error, code 1)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			client := fake.NewClientset()
			status := initContainer(tt.state)
			fakeKubelet(t, client, func(*corev1.Pod) *corev1.PodStatus { return &status })
			p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) {
				c.BridgeImage = "registry.example/boxcar:missing"
				c.StartTimeout = 5 * time.Second
			})
			_, err := p.Start(t.Context(), sandboxtest.Spec("bridge", config.SandboxSpec{}))
			if errors.Is(err, context.DeadlineExceeded) || err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Start: %v; want it to fail at once naming %q", err, tt.want)
			}
			expectNoPods(t, client)
		})
	}

	// An init container that did its work (exited 0) is no failure.
	client := fake.NewClientset()
	fakeKubelet(t, client, func(*corev1.Pod) *corev1.PodStatus {
		st := running()
		st.InitContainerStatuses = []corev1.ContainerStatus{{Name: "egress-bridge", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}}}
		return &st
	})
	p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.BridgeImage = "registry.example/boxcar:1" })
	if _, err := p.Start(t.Context(), sandboxtest.Spec("bridge", config.SandboxSpec{})); err != nil {
		t.Errorf("Start with the init container done: %v", err)
	}
}

func TestKubernetesStartTimesOutAndDeletes(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, func(*corev1.Pod) *corev1.PodStatus {
		return &corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
			Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/1 nodes are available: insufficient memory",
		}}}
	})
	p := newKubernetes(t, client)
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_, err := p.Start(ctx, sandboxtest.Spec("pending", config.SandboxSpec{}))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "insufficient memory") {
		t.Fatalf("Start: err = %v, want DeadlineExceeded naming why the pod waits", err)
	}
	expectNoPods(t, client)
}

func TestKubernetesStartRejects(t *testing.T) {
	client := fake.NewClientset()
	p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.Image = "" })
	tests := []struct {
		name string
		spec config.SandboxSpec
	}{
		{name: "no image", spec: config.SandboxSpec{}},
		{name: "workdir /", spec: config.SandboxSpec{Image: "x", Workdir: "/"}},
		{name: "workdir in /proc", spec: config.SandboxSpec{Image: "x", Workdir: "/proc/x"}},
		{name: "bad memory", spec: config.SandboxSpec{Image: "x", Memory: "much"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := p.Start(t.Context(), sandboxtest.Spec("bad", tt.spec)); err == nil {
				t.Fatal("Start succeeded, want an error")
			}
			expectNoPods(t, client)
		})
	}
	// The backend fills in no default: a spec not through config.Load is refused, naming what
	// is unset.
	t.Run("incomplete spec", func(t *testing.T) {
		_, err := p.Start(t.Context(), sandbox.Spec{JobID: "raw", SandboxSpec: config.SandboxSpec{Image: "x"}})
		if !errors.Is(err, config.ErrIncomplete) || !strings.Contains(err.Error(), "sandbox.workdir") {
			t.Fatalf("Start of a spec without defaults = %v, want ErrIncomplete naming sandbox.workdir", err)
		}
		expectNoPods(t, client)
	})
}

func TestKubernetesCloseDeletesPod(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, nil)
	p := newKubernetes(t, client)
	sb, err := p.Start(t.Context(), sandboxtest.Spec("close", config.SandboxSpec{}))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := sb.Close(t.Context()); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	expectNoPods(t, client)
}

func TestKubernetesReap(t *testing.T) {
	old := metav1.NewTime(time.Now().Add(-time.Hour))
	pod := func(name, job, worker string, created metav1.Time) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: testNamespace, CreationTimestamp: created,
			Labels: map[string]string{
				"app.kubernetes.io/managed-by": "boxcar", "app.kubernetes.io/component": "sandbox",
				"boxcar.run/job-id": job, "boxcar.run/worker": worker,
			},
			Annotations: map[string]string{"boxcar.run/job-id": job},
		}}
	}
	client := fake.NewClientset(
		pod("held", "job-held", "w1", old),
		pod("orphan", "job-gone", "w1", old),
		pod("young", "job-new", "w1", metav1.Now()),
		pod("other-worker", "job-gone", "w2", old),
	)
	p := newKubernetes(t, client)
	// w1's job-held is still running there; w2 runs nothing.
	held := func(j sandbox.PodJob) bool { return j.JobID == "job-held" && j.Worker == "w1" }
	n, err := p.Reap(t.Context(), held, time.Minute)
	if err != nil || n != 2 {
		t.Fatalf("Reap = %d, %v; want 2 pods removed", n, err)
	}
	for _, tt := range []struct {
		name string
		kept bool
	}{{"held", true}, {"orphan", false}, {"young", true}, {"other-worker", false}} {
		_, err := client.CoreV1().Pods(testNamespace).Get(t.Context(), tt.name, metav1.GetOptions{})
		if kept := err == nil; kept != tt.kept {
			t.Errorf("pod %s kept = %v, want %v (%v)", tt.name, kept, tt.kept, err)
		}
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("Get %s: %v", tt.name, err)
		}
	}
}

// TestKubernetesReapOwnInstance: two deployments of workers (two Helm releases) share a sandbox
// namespace, each with its own queue: neither can see the other's jobs as held, so each reaps
// only the pods its own Instance labelled; a worker without an Instance takes only unlabelled
// pods.
func TestKubernetesReapOwnInstance(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, nil)
	providers := map[string]*sandbox.KubernetesProvider{}
	for _, instance := range []string{"team-a.boxcar", "team-b.boxcar", ""} {
		providers[instance] = newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.Instance = instance })
	}
	pods := map[string]string{} // pod name -> instance that started it
	for instance, p := range providers {
		sb, err := p.Start(t.Context(), sandboxtest.Spec("job-"+instance, config.SandboxSpec{}))
		if err != nil {
			t.Fatal(err)
		}
		pods[sb.Info().ID] = instance
	}
	reaped := map[string]bool{}
	for _, instance := range []string{"team-a.boxcar", "", "team-b.boxcar"} {
		// No job is held: every pod this instance may see is an orphan to it.
		n, err := providers[instance].Reap(t.Context(), func(sandbox.PodJob) bool { return false }, 0)
		if err != nil || n != 1 {
			t.Fatalf("instance %q: Reap = %d, %v; want its own pod alone removed", instance, n, err)
		}
		reaped[instance] = true
		for name, owner := range pods {
			_, err := client.CoreV1().Pods(testNamespace).Get(t.Context(), name, metav1.GetOptions{})
			if gone := apierrors.IsNotFound(err); gone != reaped[owner] {
				t.Errorf("after instance %q reaped: pod %s of instance %q gone = %v, want %v (%v)", instance, name, owner, gone, reaped[owner], err)
			}
		}
	}
}

func TestNewKubernetesValidates(t *testing.T) {
	tests := []struct {
		name string
		cfg  sandbox.KubernetesConfig
	}{
		{name: "no client", cfg: sandbox.KubernetesConfig{Executor: noExec{}}},
		{name: "no rest config", cfg: sandbox.KubernetesConfig{Client: fake.NewClientset()}},
		{name: "bad tmp size", cfg: sandbox.KubernetesConfig{Client: fake.NewClientset(), Executor: noExec{}, TmpSize: "x"}},
		{name: "root", cfg: sandbox.KubernetesConfig{Client: fake.NewClientset(), Executor: noExec{}, UID: -1}},
		{name: "unknown network policy", cfg: sandbox.KubernetesConfig{Client: fake.NewClientset(), Executor: noExec{}, NetworkPolicy: "allow-all"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := sandbox.NewKubernetes(tt.cfg); err == nil {
				t.Error("NewKubernetes succeeded, want an error")
			}
		})
	}
}

func expectNoPods(t *testing.T, client *fake.Clientset) {
	t.Helper()
	pods, err := client.CoreV1().Pods(testNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		t.Errorf("pod %s left behind", p.Name)
	}
}

// TestKubernetesPodNamesItsTenant: a job's pod names its tenant, and the reaper hands it on,
// so that a worker's reaper can tell a job of a tenant it does not serve from one that is gone.
func TestKubernetesPodNamesItsTenant(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, nil)
	p := newKubernetes(t, client)
	spec := sandboxtest.Spec("job-1", config.SandboxSpec{})
	spec.Tenant = "team-a"
	sb, err := p.Start(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	pod, err := client.CoreV1().Pods(testNamespace).Get(t.Context(), sb.Info().ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := pod.Labels[sandbox.LabelTenant]; got != "team-a" {
		t.Errorf("label %s = %q, want team-a", sandbox.LabelTenant, got)
	}
	var asked []sandbox.PodJob
	if _, err := p.Reap(t.Context(), func(j sandbox.PodJob) bool { asked = append(asked, j); return true }, 0); err != nil {
		t.Fatal(err)
	}
	if want := (sandbox.PodJob{JobID: "job-1", Tenant: "team-a", Worker: "w1"}); len(asked) != 1 || asked[0] != want {
		t.Errorf("the reaper asked about %+v, want [%+v]", asked, want)
	}
}
