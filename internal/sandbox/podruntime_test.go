//go:build integration

package sandbox_test

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/remotecommand"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/spawn"
)

// Images the fake runtime knows. Pods naming any other image get ErrImagePull.
const (
	imageBusybox = "busybox:1.37"       // the busybox-static applets in /bin, as in the busybox image
	imageDebian  = "debian:12"          // the host's /usr, read-only, as in a distribution base image
	imageNoShell = "distroless:nonroot" // no sh at all
	// imageGerman is imageDebian with a German environment of its own (ENV), as an image built
	// for German users sets it: LANGUAGE alone, past the pod's LANG=C.UTF-8, puts its tools'
	// errors in the host's German translations.
	imageGerman = "debian:12-de"
)

// imageEnv is the environment an image sets (its ENV), which the pod spec's env overrides name
// by name.
var imageEnv = map[string][]string{
	imageGerman: {"LANG=de_DE.UTF-8", "LANGUAGE=de_DE:de"},
}

// podRuntime plays the kubelet and the container runtime for the sandbox pods made through a
// fake clientset, and the API server's pods/exec subresource over HTTPS: WebSocket
// (v5.channel.k8s.io and v4.channel.k8s.io) and SPDY/3.1.
//
// Each pod is a real process tree. The pod's own command runs as pid 1 in new user,
// mount, pid, ipc, uts and network namespaces (bubblewrap), as the pod's runAsUser, with the
// image read-only at / and each emptyDir a host folder mounted where the pod spec says. Every
// exec enters those namespaces (nsenter), as runc exec does, with the container's environment
// and working folder. Like a real runtime, it answers an exec of a program that is not in the
// image with an internal-error status rather than an exit code, and closing an exec stream
// does not stop the command: only killing it inside the pod, or deleting the pod, does.
type podRuntime struct {
	t       testing.TB
	client  *fake.Clientset
	srv     *httptest.Server
	token   string
	root    string // host folders of the pods' volumes
	bwrap   string
	nsenter string
	busybox string // a static busybox, for imageBusybox
	applets []string

	mu     sync.Mutex
	faults runtimeFaults
	pods   map[string]*fakePod
	execs  []execRecord

	wg sync.WaitGroup // exec handlers
}

// runtimeFaults change how the fake API server and runtime answer.
type runtimeFaults struct {
	// refuseWebSocket, when not 0, is the HTTP status a WebSocket upgrade gets instead.
	refuseWebSocket int
	// wsProtocols are the subprotocols spoken over WebSocket. Default: v5 and v4.
	wsProtocols []string
	// execFault, when it returns an error, is a runtime failure to start the exec.
	execFault func(argv []string) error
	// execArgv, when set, changes what the pod runs; the record keeps what was asked.
	execArgv func(argv []string) []string
}

// run is the argv the pod runs for one asked for.
func (f runtimeFaults) run(argv []string) []string {
	if f.execArgv == nil {
		return argv
	}
	return f.execArgv(slices.Clone(argv))
}

// execRecord is what the server saw of one exec request.
type execRecord struct {
	Transport string // "websocket" or "spdy"
	Refused   int    // the HTTP status a refused upgrade got
	Protocol  string // the negotiated subprotocol
	Argv      []string
	// StdinClosed is true when the client signalled the end of stdin: the v5 close signal
	// on channel 255, or SPDY's half-close.
	StdinClosed bool
	Status      metav1.Status // what the status channel carried
}

// fakePod is one running pod.
type fakePod struct {
	name     string
	dir      string
	cmd      *exec.Cmd // bwrap, outside the pod's namespaces
	pid      int       // pid 1 of the pod's pid namespace, as the host numbers it
	uid, gid int64
	env      []string
	workdir  string
	done     chan struct{} // closed when cmd has been waited for
}

func newPodRuntime(t testing.TB) *podRuntime {
	t.Helper()
	rt := &podRuntime{
		t: t, client: fake.NewClientset(), token: "boxcar-test-" + strconv.FormatInt(time.Now().UnixNano(), 36),
		root: t.TempDir(), pods: map[string]*fakePod{},
		faults: runtimeFaults{wsProtocols: []string{remotecommand.StreamProtocolV5Name, remotecommand.StreamProtocolV4Name}},
	}
	var err error
	if rt.bwrap, err = exec.LookPath("bwrap"); err != nil {
		t.Fatal("the fake kubelet runs pods with bubblewrap: apt-get install -y bubblewrap")
	}
	if rt.nsenter, err = exec.LookPath("nsenter"); err != nil {
		t.Fatal("the fake kubelet enters pods with nsenter: apt-get install -y util-linux")
	}
	rt.busybox, rt.applets = staticBusybox(t)

	mux := http.NewServeMux()
	mux.HandleFunc("/api/v1/namespaces/{namespace}/pods/{pod}/exec", rt.serveExec)
	rt.srv = httptest.NewUnstartedServer(mux)
	rt.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // clients that hang up are expected
	rt.srv.StartTLS()

	ctx, cancel := context.WithCancel(context.Background())
	w, err := rt.client.CoreV1().Pods(testNamespace).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeletDone := make(chan struct{})
	go func() {
		defer close(kubeletDone)
		rt.kubelet(ctx, w)
	}()
	t.Cleanup(func() {
		cancel()
		w.Stop()
		<-kubeletDone // no pod starts after this
		rt.mu.Lock()
		pods := rt.pods
		rt.pods = map[string]*fakePod{}
		rt.mu.Unlock()
		for _, p := range pods {
			p.stop() // which ends the execs still running in them
		}
		// No request starts after this, so the handlers counted are all there will be.
		rt.srv.CloseClientConnections()
		rt.srv.Close()
		rt.wg.Wait()
	})
	return rt
}

// staticBusybox finds a statically linked busybox, which runs in a rootfs of its own. Tests
// that need it fail without it: the wrappers must be proven against busybox's tools.
func staticBusybox(t testing.TB) (string, []string) {
	t.Helper()
	const advice = "install it with `apt-get install -y busybox-static` (scripts/deps.sh test does)"
	bin, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatalf("busybox is missing: %s", advice)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatalf("%s: %v: %s", bin, err, advice)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("%s is linked dynamically and cannot make an image of its own: %s", bin, advice)
		}
	}
	out, err := exec.Command(bin, "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	var applets []string
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			applets = append(applets, a)
		}
	}
	return bin, applets
}

// restConfig is what a worker would load from its kubeconfig: the server, its CA, a token.
func (rt *podRuntime) restConfig() *rest.Config {
	return &rest.Config{
		Host:            rt.srv.URL,
		BearerToken:     rt.token,
		TLSClientConfig: rest.TLSClientConfig{CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: rt.srv.Certificate().Raw})},
		// Never a proxy from the environment: nothing may leave 127.0.0.1.
		Proxy: func(*http.Request) (*url.URL, error) { return nil, nil },
	}
}

// provider is a kubernetes backend using the real pods/exec client against this runtime.
func (rt *podRuntime) provider(t testing.TB, image string) *sandbox.KubernetesProvider {
	t.Helper()
	p, err := sandbox.NewKubernetes(sandbox.KubernetesConfig{
		Client: rt.client, RESTConfig: rt.restConfig(), Namespace: testNamespace,
		Image: image, StartTimeout: 20 * time.Second, WorkerID: "w1",
	})
	if err != nil {
		t.Fatalf("NewKubernetes: %v", err)
	}
	return p
}

func (rt *podRuntime) setFaults(edit func(*runtimeFaults)) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	edit(&rt.faults)
}

func (rt *podRuntime) currentFaults() runtimeFaults {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.faults
}

// records returns what the server saw so far.
func (rt *podRuntime) records() []execRecord {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return slices.Clone(rt.execs)
}

func (rt *podRuntime) record(r execRecord) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.execs = append(rt.execs, r)
}

func (rt *podRuntime) pod(name string) *fakePod {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.pods[name]
}

// kubelet starts each new pod and gives it a status, and stops each deleted one.
func (rt *podRuntime) kubelet(ctx context.Context, w watch.Interface) {
	for ev := range w.ResultChan() {
		pod, ok := ev.Object.(*corev1.Pod)
		if !ok {
			continue
		}
		switch ev.Type {
		case watch.Added:
			st := rt.startPod(pod)
			pod = pod.DeepCopy()
			pod.Status = st
			if _, err := rt.client.CoreV1().Pods(testNamespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil {
				rt.t.Errorf("fake kubelet: update status of %s: %v", pod.Name, err)
			}
		case watch.Deleted:
			rt.mu.Lock()
			p := rt.pods[pod.Name]
			delete(rt.pods, pod.Name)
			rt.mu.Unlock()
			if p != nil {
				p.stop()
			}
		}
	}
}

// startPod runs the pod's container and returns the status a kubelet would report.
func (rt *podRuntime) startPod(pod *corev1.Pod) corev1.PodStatus {
	c := pod.Spec.Containers[0]
	layout, known := rt.imageLayout(c.Image)
	if !known {
		return corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
			Name: c.Name, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
				Reason: "ErrImagePull", Message: fmt.Sprintf("failed to pull image %q: no registry is reachable", c.Image),
			}},
		}}}
	}
	host := pod.Name // the kubelet's host name for a pod that names none
	if pod.Spec.Hostname != "" {
		host = pod.Spec.Hostname
	}
	p := &fakePod{
		name: pod.Name, dir: filepath.Join(rt.root, pod.Name), uid: 65534, gid: 65534,
		workdir: c.WorkingDir, done: make(chan struct{}),
		env: append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME=" + host}, imageEnv[c.Image]...),
	}
	if sc := pod.Spec.SecurityContext; sc != nil && sc.RunAsUser != nil {
		p.uid = *sc.RunAsUser
	}
	if sc := pod.Spec.SecurityContext; sc != nil && sc.RunAsGroup != nil {
		p.gid = *sc.RunAsGroup
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			rt.t.Errorf("pod %s: env %s comes from elsewhere; sandbox pods take nothing from secrets or the API", pod.Name, e.Name)
		}
		p.env = append(p.env, e.Name+"="+e.Value)
	}

	args := []string{
		"--unshare-user", "--uid", strconv.FormatInt(p.uid, 10), "--gid", strconv.FormatInt(p.gid, 10),
		"--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--hostname", host,
		"--die-with-parent", "--cap-drop", "ALL", "--info-fd", "3",
		// As a runtime does: the pod's command is its pid 1 (which orphans re-parent to), not
		// a reaper of bwrap's, and leads a session of its own (runc's setsid).
		"--as-pid-1", "--new-session",
	}
	args = append(args, layout...)
	args = append(args, "--proc", "/proc", "--dev", "/dev")
	volumes := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v.EmptyDir != nil
	}
	for _, m := range c.VolumeMounts {
		if !volumes[m.Name] {
			rt.t.Errorf("pod %s: volume %s is not an emptyDir", pod.Name, m.Name)
			continue
		}
		host := filepath.Join(p.dir, "volumes", m.Name)
		if err := os.MkdirAll(host, 0o755); err != nil {
			rt.t.Errorf("pod %s: %v", pod.Name, err)
		}
		args = append(args, "--bind", host, m.MountPath)
	}
	if sc := c.SecurityContext; sc != nil && sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		args = append(args, "--remount-ro", "/")
	}
	if p.workdir != "" {
		args = append(args, "--chdir", p.workdir)
	}
	args = append(args, "--clearenv")
	for _, kv := range p.env {
		k, v, _ := strings.Cut(kv, "=")
		args = append(args, "--setenv", k, v)
	}
	argv := append(slices.Clone(c.Command), c.Args...)
	args = append(append(args, "--"), argv...)

	// This runs on the kubelet's goroutine, where a test may not stop: failures are reported
	// and the pod fails.
	broken := func(format string, args ...any) corev1.PodStatus {
		rt.t.Errorf("fake kubelet: pod %s: "+format, append([]any{pod.Name}, args...)...)
		return corev1.PodStatus{Phase: corev1.PodFailed, Reason: "FakeKubeletError"}
	}
	infoRead, infoWrite, err := os.Pipe()
	if err != nil {
		return broken("%v", err)
	}
	defer infoRead.Close()
	var logs bytes.Buffer
	p.cmd = exec.Command(rt.bwrap, args...)
	p.cmd.Env = []string{}
	p.cmd.Stdout, p.cmd.Stderr = &logs, &logs
	p.cmd.ExtraFiles = []*os.File{infoWrite}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = spawn.Start(p.cmd)
	infoWrite.Close()
	if err != nil {
		return broken("start: %v", err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	var info struct {
		ChildPID int `json:"child-pid"`
	}
	if err := json.NewDecoder(infoRead).Decode(&info); err != nil || info.ChildPID == 0 {
		p.stop()
		return broken("did not start: %v\n%s", err, logs.String())
	}
	p.pid = info.ChildPID
	// Running means the pod's command runs: bwrap has built the pod's filesystem and exec'd it.
	for deadline := time.Now().Add(10 * time.Second); !p.commandRuns(rt.bwrap); {
		select {
		case <-p.done:
			p.stop()
			// runc fails the container's start, and the kubelet reports it so.
			msg := "failed to create containerd task: " + strings.TrimSpace(logs.String())
			if strings.Contains(msg, "execvp") {
				msg = fmt.Sprintf("failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: exec: %q: executable file not found in $PATH: unknown", firstOr(argv))
			}
			return corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{
				Name: c.Name, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError", Message: msg}},
			}}}
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop()
			return broken("its command did not start\n%s", logs.String())
		}
	}
	rt.mu.Lock()
	rt.pods[pod.Name] = p
	rt.mu.Unlock()

	st := running()
	st.ContainerStatuses[0].Name = c.Name
	st.ContainerStatuses[0].ImageID = "docker.io/library/" + c.Image + "@sha256:" + strings.Repeat("ab", 32)
	return st
}

func firstOr(argv []string) string {
	if len(argv) == 0 {
		return ""
	}
	return argv[0]
}

// imageLayout is the bwrap options that make an image's filesystem.
func (rt *podRuntime) imageLayout(image string) ([]string, bool) {
	switch image {
	case imageBusybox:
		args := []string{"--dir", "/bin", "--ro-bind", rt.busybox, "/bin/busybox"}
		for _, a := range rt.applets {
			args = append(args, "--symlink", "busybox", "/bin/"+a)
		}
		return append(args, "--dir", "/etc", "--dir", "/home"), true
	case imageDebian, imageGerman:
		var args []string
		for _, dir := range []string{"/usr", "/bin", "/sbin", "/lib", "/lib64"} {
			fi, err := os.Lstat(dir)
			switch {
			case err != nil:
			case fi.Mode()&os.ModeSymlink != 0:
				target, _ := os.Readlink(dir)
				args = append(args, "--symlink", target, dir)
			default:
				args = append(args, "--ro-bind", dir, dir)
			}
		}
		args = append(args, "--dir", "/etc")
		if _, err := os.Stat("/etc/ld.so.cache"); err == nil {
			args = append(args, "--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache")
		}
		return args, true
	case imageNoShell:
		return []string{"--dir", "/etc", "--dir", "/app"}, true
	}
	return nil, false
}

// lookPath says whether name is a program on the container's PATH, looking into the running
// pod's filesystem.
func (p *fakePod) lookPath(name string) bool {
	exists := func(file string) bool {
		fi, err := os.Stat(filepath.Join("/proc", strconv.Itoa(p.pid), "root", file))
		return err == nil && fi.Mode().IsRegular()
	}
	if strings.Contains(name, "/") {
		return exists(path.Join(p.workdir, name))
	}
	for _, kv := range p.env {
		if dirs, ok := strings.CutPrefix(kv, "PATH="); ok {
			for _, dir := range strings.Split(dirs, ":") {
				if exists(path.Join(dir, name)) {
					return true
				}
			}
		}
	}
	return false
}

// commandRuns says whether the pod's command has started: a process of the pod's pid
// namespace that is no longer bwrap (its pid 1, or its child before the exec).
func (p *fakePod) commandRuns(bwrap string) bool {
	podNS, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(p.pid), "ns", "pid"))
	if err != nil {
		return false
	}
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		if d.Name() == strconv.Itoa(p.pid) {
			continue
		}
		if ns, err := os.Readlink(filepath.Join("/proc", d.Name(), "ns", "pid")); err != nil || ns != podNS {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err == nil && len(cmdline) > 0 && !bytes.HasPrefix(cmdline, []byte(bwrap+"\x00")) {
			return true
		}
	}
	return false
}

// stop kills the pod's processes (all of them: pid 1 of a pid namespace takes the rest with it)
// and removes its volumes.
func (p *fakePod) stop() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	if p.pid != 0 {
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	_ = os.RemoveAll(p.dir)
}

// processes lists the pod's processes as "pid:cmdline", read from the host: everything in
// the pod's pid namespace.
func (p *fakePod) processes(t testing.TB) []string {
	t.Helper()
	podNS, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(p.pid), "ns", "pid"))
	if err != nil {
		return nil // the pod is gone, and its processes with it
	}
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		ns, err := os.Readlink(filepath.Join("/proc", d.Name(), "ns", "pid"))
		if err != nil || ns != podNS {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		out = append(out, d.Name()+":"+strings.TrimSpace(string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))))
	}
	return out
}
