package sandbox_test

import (
	"context"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	utilexec "k8s.io/client-go/util/exec"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

const testNamespace = "boxcar-sandboxes"

// localExecutor runs the commands meant for a pod on this host instead. It is enough to exercise
// the shell wrappers the backend sends (timeouts, environment, file transfer and confinement)
// with the workdir a host folder; like a pods/exec stream, cancelling it ends the stream but
// not the command.
//
// bin, when set, is a folder of busybox applets that the wrappers run with instead of the host's
// tools, as in a busybox image.
type localExecutor struct{ bin string }

func (e localExecutor) Exec(ctx context.Context, _, _ string, argv []string, stdin io.Reader, stdout, stderr io.Writer) error {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	if e.bin != "" {
		cmd.Path = filepath.Join(e.bin, argv[0])
		cmd.Env = []string{"PATH=" + e.bin}
	}
	cmd.Dir = "/"
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	cmd.WaitDelay = 200 * time.Millisecond // the command's children may hold the pipes
	err := cmd.Run()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code := ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
		return utilexec.CodeExitError{Err: err, Code: code}
	}
	return err
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
	cfg := sandbox.KubernetesConfig{Client: client, Executor: localExecutor{}, Image: "busybox:1.37", StartTimeout: 10 * time.Second, WorkerID: "w1"}
	for _, e := range edit {
		e(&cfg)
	}
	p, err := sandbox.NewKubernetes(cfg)
	if err != nil {
		t.Fatalf("NewKubernetes: %v", err)
	}
	return p
}

// hostWorkdir starts each sandbox with a fresh host folder as its workdir, for localExecutor.
type hostWorkdir struct {
	*sandbox.KubernetesProvider
	t testing.TB
}

func (h hostWorkdir) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	spec.Workdir = h.t.TempDir()
	return h.KubernetesProvider.Start(ctx, spec)
}

func TestKubernetesConformance(t *testing.T) {
	sandboxtest.Run(t, func(t *testing.T) sandbox.Provider {
		client := fake.NewClientset()
		fakeKubelet(t, client, nil)
		return hostWorkdir{newKubernetes(t, client), t}
	})
}

// TestKubernetesConformanceBusybox runs the wrappers with busybox's sh and tools, as in the
// minimal images sandbox pods often use.
func TestKubernetesConformanceBusybox(t *testing.T) {
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("busybox is not installed (apt-get install -y busybox-static); the wrappers are tested with the host's sh only")
	}
	bin := t.TempDir()
	if out, err := exec.Command(busybox, "--install", "-s", bin).CombinedOutput(); err != nil {
		t.Fatalf("busybox --install: %v\n%s", err, out)
	}
	sandboxtest.Run(t, func(t *testing.T) sandbox.Provider {
		client := fake.NewClientset()
		fakeKubelet(t, client, nil)
		return hostWorkdir{newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.Executor = localExecutor{bin: bin} }), t}
	})
}

func TestKubernetesPodSpec(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, nil)
	p := newKubernetes(t, client)
	sb := start(t, p, config.SandboxSpec{Image: "registry.example/tools:1", CPU: "500m", Memory: "256Mi", Disk: "1Gi", RuntimeClass: "gvisor", Lifetime: config.Duration(20 * time.Minute)})

	pods, err := client.CoreV1().Pods(testNamespace).List(t.Context(), metav1.ListOptions{})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("want one pod, got %d (%v)", len(pods.Items), err)
	}
	pod := pods.Items[0]

	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range eval.EvaluatePod(psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}, &pod.ObjectMeta, &pod.Spec) {
		if !r.Allowed {
			t.Errorf("Pod Security Standard restricted: %s (%s)", r.ForbiddenReason, r.ForbiddenDetail)
		}
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
		{"job label", pod.Labels["boxcar.run/job-id"] == "test" && pod.Annotations["boxcar.run/job-id"] == "test"},
		{"worker label", pod.Labels["boxcar.run/worker"] == "w1"},
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
			_, err := p.Start(t.Context(), sandbox.Spec{JobID: "fail"})
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
	_, err := p.Start(ctx, sandbox.Spec{JobID: "pending"})
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
			if _, err := p.Start(t.Context(), sandbox.Spec{JobID: "bad", SandboxSpec: tt.spec}); err == nil {
				t.Fatal("Start succeeded, want an error")
			}
			expectNoPods(t, client)
		})
	}
}

func TestKubernetesCloseDeletesPod(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, nil)
	p := newKubernetes(t, client)
	sb, err := p.Start(t.Context(), sandbox.Spec{JobID: "close", SandboxSpec: config.SandboxSpec{Workdir: t.TempDir()}})
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
	n, err := p.Reap(t.Context(), func(job string) bool { return job == "job-held" }, time.Minute)
	if err != nil || n != 1 {
		t.Fatalf("Reap = %d, %v; want 1 pod removed", n, err)
	}
	for _, tt := range []struct {
		name string
		kept bool
	}{{"held", true}, {"orphan", false}, {"young", true}, {"other-worker", true}} {
		_, err := client.CoreV1().Pods(testNamespace).Get(t.Context(), tt.name, metav1.GetOptions{})
		if kept := err == nil; kept != tt.kept {
			t.Errorf("pod %s kept = %v, want %v (%v)", tt.name, kept, tt.kept, err)
		}
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("Get %s: %v", tt.name, err)
		}
	}
}

func TestNewKubernetesValidates(t *testing.T) {
	tests := []struct {
		name string
		cfg  sandbox.KubernetesConfig
	}{
		{name: "no client", cfg: sandbox.KubernetesConfig{Executor: localExecutor{}}},
		{name: "no rest config", cfg: sandbox.KubernetesConfig{Client: fake.NewClientset()}},
		{name: "bad tmp size", cfg: sandbox.KubernetesConfig{Client: fake.NewClientset(), Executor: localExecutor{}, TmpSize: "x"}},
		{name: "root", cfg: sandbox.KubernetesConfig{Client: fake.NewClientset(), Executor: localExecutor{}, UID: -1}},
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
