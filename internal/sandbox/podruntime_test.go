package sandbox_test

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
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
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/remotecommand"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	"k8s.io/streaming/pkg/httpstream"
	"k8s.io/streaming/pkg/httpstream/spdy"

	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// Images the fake runtime knows. Pods naming any other image get ErrImagePull.
const (
	imageBusybox = "busybox:1.37"       // the busybox-static applets in /bin, as in the busybox image
	imageDebian  = "debian:12"          // the host's /usr, read-only, as in a distribution base image
	imageNoShell = "distroless:nonroot" // no sh at all
)

// podRuntime plays the kubelet and the container runtime for the sandbox pods made through a
// fake clientset, and the API server's pods/exec subresource over HTTPS: WebSocket
// (v5.channel.k8s.io and v4.channel.k8s.io) and SPDY/3.1.
//
// Each pod is a real process tree. The pod's own command runs as pid 1's child in new user,
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
	p := &fakePod{
		name: pod.Name, dir: filepath.Join(rt.root, pod.Name), uid: 65534, gid: 65534,
		workdir: c.WorkingDir, done: make(chan struct{}),
		env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME=" + pod.Name},
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
		"--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--hostname", pod.Name,
		"--die-with-parent", "--cap-drop", "ALL", "--info-fd", "3",
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
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = p.cmd.Start()
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
	case imageDebian:
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

// exec runs argv in the pod as runc exec would and returns the status the kubelet sends.
// stdinEOF reports whether stdin reached its end (the client closed it).
func (p *fakePod) exec(nsenter string, argv []string, stdin io.Reader, stdout, stderr io.Writer, fault func([]string) error) (st metav1.Status, stdinEOF bool) {
	if fault != nil {
		if err := fault(argv); err != nil {
			return internalError(err), false
		}
	}
	if !p.lookPath(argv[0]) {
		// What containerd answers; the kubelet turns it into an internal error, not 127.
		return internalError(fmt.Errorf("failed to exec in container: failed to start exec: OCI runtime exec failed: exec failed: unable to start container process: exec: %q: executable file not found in $PATH: unknown", argv[0])), false
	}
	// The root and working folder of the pod's pid 1, which bwrap started in the container's
	// WorkingDir (--wd=DIR would resolve DIR on the host).
	args := []string{"--target", strconv.Itoa(p.pid), "--user", "--mount", "--pid", "--root", "--wd",
		"--setuid", strconv.FormatInt(p.uid, 10), "--setgid", strconv.FormatInt(p.gid, 10), "--"}
	cmd := exec.Command(nsenter, append(args, argv...)...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = stdout, stderr
	var copied sync.WaitGroup
	if stdin != nil {
		w, err := cmd.StdinPipe()
		if err != nil {
			return internalError(err), false
		}
		copied.Go(func() {
			_, err := io.Copy(w, stdin)
			stdinEOF = err == nil
			w.Close()
			_, _ = io.Copy(io.Discard, stdin) // what the command did not read
		})
	}
	err := cmd.Run()
	if c, ok := stdin.(io.Closer); ok {
		c.Close() // the command is gone: stop waiting for input
	}
	copied.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return metav1.Status{TypeMeta: statusType, Status: metav1.StatusSuccess}, stdinEOF
	case errors.As(err, &ee):
		code := ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
		return metav1.Status{
			TypeMeta: statusType, Status: metav1.StatusFailure, Reason: remotecommand.NonZeroExitCodeReason,
			Message: fmt.Sprintf("command terminated with non-zero exit code: error executing command %q, exit code %d", argv, code),
			Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: remotecommand.ExitCodeCauseType, Message: strconv.Itoa(code)}}},
		}, stdinEOF
	}
	return internalError(err), stdinEOF
}

var statusType = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}

func internalError(err error) metav1.Status {
	st := apierrors.NewInternalError(err).ErrStatus
	st.TypeMeta = statusType
	return st
}

// writeStatus answers a request that is not upgraded, as the API server does.
func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: statusType, Status: metav1.StatusFailure, Code: int32(code), Reason: reason, Message: msg})
}

// serveExec is POST/GET /api/v1/namespaces/{namespace}/pods/{pod}/exec.
func (rt *podRuntime) serveExec(w http.ResponseWriter, r *http.Request) {
	rt.wg.Add(1)
	defer rt.wg.Done()
	if r.Header.Get("Authorization") != "Bearer "+rt.token {
		writeStatus(w, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized")
		return
	}
	q := r.URL.Query()
	argv := q["command"]
	pod := rt.pod(r.PathValue("pod"))
	switch {
	case r.PathValue("namespace") != testNamespace || pod == nil:
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("pods %q not found", r.PathValue("pod")))
		return
	case q.Get("container") != "sandbox":
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("container %q is not valid for pod %s", q.Get("container"), pod.name))
		return
	case len(argv) == 0 || q.Get("stdout") != "true" || q.Get("stderr") != "true" || q.Get("tty") == "true":
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, "want a command, stdout, stderr and no tty")
		return
	}
	stdin := q.Get("stdin") == "true"
	if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		rt.serveWebSocket(w, r, pod, argv, stdin)
		return
	}
	rt.serveSPDY(w, r, pod, argv, stdin)
}

// serveWebSocket speaks the channel protocol: one byte of channel (0 stdin, 1 stdout, 2
// stderr, 3 status, 4 resize) before each binary message; in v5, the message 255 <channel>
// closes a channel (the client's stdin).
func (rt *podRuntime) serveWebSocket(w http.ResponseWriter, r *http.Request, pod *fakePod, argv []string, wantStdin bool) {
	faults := rt.currentFaults()
	if faults.refuseWebSocket != 0 {
		rt.record(execRecord{Transport: "websocket", Refused: faults.refuseWebSocket, Argv: argv})
		writeStatus(w, faults.refuseWebSocket, metav1.StatusReasonForbidden, "websocket upgrades are refused here")
		return
	}
	up := websocket.Upgrader{
		Subprotocols: faults.wsProtocols, ReadBufferSize: 32 << 10, WriteBufferSize: 32 << 10,
		CheckOrigin: func(*http.Request) bool { return true },
	}
	conn, err := up.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader has answered
	}
	defer conn.Close()
	rec := execRecord{Transport: "websocket", Protocol: conn.Subprotocol(), Argv: argv}
	if rec.Protocol == "" {
		// The client asked for no subprotocol this server speaks; it hangs up.
		rt.record(rec)
		return
	}
	var writeMu sync.Mutex
	send := func(channel byte, data []byte) error {
		writeMu.Lock()
		defer writeMu.Unlock()
		_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
		return conn.WriteMessage(websocket.BinaryMessage, append([]byte{channel}, data...))
	}

	stdinRead, stdinWrite := io.Pipe()
	var closeSignal atomic.Bool
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer stdinWrite.Close()
		for {
			typ, data, err := conn.ReadMessage()
			if err != nil {
				return
			}
			if typ != websocket.BinaryMessage || len(data) == 0 {
				continue
			}
			switch {
			case data[0] == remotecommand.StreamClose && rec.Protocol == remotecommand.StreamProtocolV5Name:
				if len(data) == 2 && data[1] == remotecommand.StreamStdIn {
					closeSignal.Store(true)
					stdinWrite.Close()
				}
			case data[0] == remotecommand.StreamStdIn:
				_, _ = stdinWrite.Write(data[1:]) // fails once the command is gone
			}
		}
	}()

	var in io.Reader
	if wantStdin {
		in = stdinRead
	}
	st, _ := pod.exec(rt.nsenter, argv, in, channelWriter{send, remotecommand.StreamStdOut}, channelWriter{send, remotecommand.StreamStdErr}, faults.execFault)
	stdinRead.Close()
	rec.Status = st
	status, _ := json.Marshal(st)
	if send(remotecommand.StreamErr, status) == nil {
		writeMu.Lock()
		_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(5*time.Second))
		writeMu.Unlock()
	}
	select {
	case <-readDone: // the client answered the close, or hung up
	case <-time.After(10 * time.Second):
	}
	rec.StdinClosed = closeSignal.Load()
	rt.record(rec)
}

// channelWriter sends a stream on one channel. Once the client is gone it drops what the
// command writes, as a runtime does: a vanished client does not stop the command.
type channelWriter struct {
	send    func(byte, []byte) error
	channel byte
}

func (c channelWriter) Write(p []byte) (int, error) {
	_ = c.send(c.channel, p)
	return len(p), nil
}

// serveSPDY speaks remotecommand v4 over SPDY/3.1, as the kubelet does for older clients:
// one stream per channel, the status as JSON on the error stream.
func (rt *podRuntime) serveSPDY(w http.ResponseWriter, r *http.Request, pod *fakePod, argv []string, wantStdin bool) {
	faults := rt.currentFaults()
	protocol, err := httpstream.Handshake(r, w, []string{remotecommand.StreamProtocolV4Name})
	if err != nil {
		return // Handshake has answered
	}
	type arrival struct {
		stream    httpstream.Stream
		replySent <-chan struct{}
	}
	arrivals := make(chan arrival, 8)
	conn := spdy.NewResponseUpgrader().UpgradeResponse(w, r, func(s httpstream.Stream, replySent <-chan struct{}) error {
		arrivals <- arrival{s, replySent}
		return nil
	})
	if conn == nil {
		return
	}
	defer conn.Close()
	want := 3
	if wantStdin {
		want++
	}
	streams := map[string]httpstream.Stream{}
	timeout := time.After(10 * time.Second)
	for len(streams) < want {
		select {
		case a := <-arrivals:
			<-a.replySent
			streams[a.stream.Headers().Get(corev1.StreamType)] = a.stream
		case <-timeout:
			rt.t.Errorf("spdy exec: got streams %v, want %d", slices.Collect(maps.Keys(streams)), want)
			return
		}
	}
	rec := execRecord{Transport: "spdy", Protocol: protocol, Argv: argv}
	var in io.Reader
	if wantStdin {
		in = streams[corev1.StreamTypeStdin]
	}
	out := dropOnError{streams[corev1.StreamTypeStdout]}
	errOut := dropOnError{streams[corev1.StreamTypeStderr]}
	rec.Status, rec.StdinClosed = pod.exec(rt.nsenter, argv, in, out, errOut, faults.execFault)
	status, _ := json.Marshal(rec.Status)
	_, _ = streams[corev1.StreamTypeError].Write(status)
	for _, s := range streams {
		s.Close()
	}
	select {
	case <-conn.CloseChan(): // the client has read everything and hung up
	case <-time.After(10 * time.Second):
	}
	rt.record(rec)
}

// dropOnError keeps a command writing after its client left.
type dropOnError struct{ w io.Writer }

func (d dropOnError) Write(p []byte) (int, error) {
	_, _ = d.w.Write(p)
	return len(p), nil
}
