package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/bridge"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
	"github.com/boxcar-run/boxcar/internal/sandbox/tunnel"
	"github.com/boxcar-run/boxcar/test/harness"
)

const bridgeImage = "ghcr.io/boxcar-run/boxcar:test"

func onePod(t *testing.T, client *fake.Clientset) corev1.Pod {
	t.Helper()
	pods, err := client.CoreV1().Pods(testNamespace).List(t.Context(), metav1.ListOptions{})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("want one pod, got %d (%v)", len(pods.Items), err)
	}
	return pods.Items[0]
}

// TestKubernetesEgressPodSpec: with a bridge image, every sandbox pod gets the init container
// that puts the tunnel's binary in a volume the sandbox mounts read-only, and the CA's folder;
// still no port, no host network, the same deny-all labels, and Pod Security "restricted".
func TestKubernetesEgressPodSpec(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, nil)
	p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.BridgeImage = bridgeImage })
	sandboxtest.StartSpec(t, p, config.SandboxSpec{Disk: "1Gi", Memory: "256Mi"})
	pod := onePod(t, client)

	for _, refusal := range restrictedRefusals(t, &pod) {
		t.Errorf("Pod Security Standard restricted: %s", refusal)
	}
	if len(pod.Spec.InitContainers) != 1 {
		t.Fatalf("init containers: %d, want 1", len(pod.Spec.InitContainers))
	}
	init, c := pod.Spec.InitContainers[0], pod.Spec.Containers[0]
	mount := func(c corev1.Container, path string) *corev1.VolumeMount {
		i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == path })
		if i < 0 {
			return nil
		}
		return &c.VolumeMounts[i]
	}
	binMount, caMount, initMount := mount(c, "/run/boxcar"), mount(c, "/run/boxcar/egress"), mount(init, "/run/boxcar")
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	sized := func(m *corev1.VolumeMount) bool {
		v, ok := volumes[m.Name]
		return ok && v.EmptyDir != nil && v.EmptyDir.SizeLimit != nil && !v.EmptyDir.SizeLimit.IsZero()
	}
	storage := c.Resources.Limits[corev1.ResourceEphemeralStorage]
	for _, check := range []struct {
		name string
		ok   bool
	}{
		{"init runs the worker image's binary in install mode", init.Image == bridgeImage && slices.Equal(init.Command, []string{"/usr/local/bin/worker", tunnel.InstallArg, bridge.Path})},
		{"init asks for what the sandbox asks", init.Resources.Limits.Memory().Equal(*c.Resources.Limits.Memory()) && init.Resources.Limits.Cpu().Equal(*c.Resources.Limits.Cpu())},
		{"init writes the bridge volume", initMount != nil && !initMount.ReadOnly && binMount != nil && initMount.Name == binMount.Name},
		{"the sandbox mounts the binary read-only", binMount != nil && binMount.ReadOnly && sized(binMount)},
		{"the CA's folder is a volume of its own", caMount != nil && caMount.Name != binMount.Name && sized(caMount)},
		{"ephemeral storage counts both volumes", storage.Cmp(*volumes["workdir"].EmptyDir.SizeLimit) > 0 && storage.Value() >= (1<<30)+(64<<20)+(128<<20)+(4<<20)},
		{"no port", len(c.Ports) == 0 && len(init.Ports) == 0},
		{"no host network", !pod.Spec.HostNetwork},
		{"deny-all policy label", pod.Labels["app.kubernetes.io/component"] == "sandbox"},
		{"no service-account token", pod.Spec.AutomountServiceAccountToken != nil && !*pod.Spec.AutomountServiceAccountToken},
	} {
		if !check.ok {
			t.Errorf("pod spec: %s does not hold", check.name)
		}
	}
}

// TestKubernetesNoBridgeNoInit: without a bridge image, pods are as they were, and a profile
// with a network fails to attach with ErrNoEgress, naming the setting.
func TestKubernetesNoBridgeNoInit(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, nil)
	sb := sandboxtest.StartSpec(t, newKubernetes(t, client), config.SandboxSpec{})
	pod := onePod(t, client)
	if len(pod.Spec.InitContainers) != 0 || len(pod.Spec.Volumes) != 2 {
		t.Errorf("init containers %d, volumes %d; want 0 and 2 (workdir, tmp)", len(pod.Spec.InitContainers), len(pod.Spec.Volumes))
	}
	_, err := sb.(sandbox.Egress).AttachEgress(t.Context(), []byte("ca"))
	if !errors.Is(err, sandbox.ErrNoEgress) || !strings.Contains(err.Error(), "bridge_image") {
		t.Errorf("AttachEgress: %v, want ErrNoEgress naming sandbox.kubernetes.bridge_image", err)
	}
}

// tunnelExec plays the pod for AttachEgress: the CA write keeps what it was sent, and the
// tunnel runs the real pod side (tunnel.Pod) listening on the test's loopback.
type tunnelExec struct {
	fail string // when set, the tunnel's exec says this on stderr and ends

	mu     sync.Mutex
	ca     bytes.Buffer
	addr   chan string
	ended  chan struct{}
	tunnel [][]string
}

func newTunnelExec() *tunnelExec {
	return &tunnelExec{addr: make(chan string, 1), ended: make(chan struct{})}
}

func (e *tunnelExec) Exec(ctx context.Context, _, _ string, argv []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if argv[0] == "sh" {
		e.mu.Lock()
		defer e.mu.Unlock()
		if argv[len(argv)-1] != sandbox.EgressCAFile {
			return fmt.Errorf("unexpected command %q", argv)
		}
		_, err := io.Copy(&e.ca, stdin)
		return err
	}
	e.mu.Lock()
	e.tunnel = append(e.tunnel, argv)
	e.mu.Unlock()
	if e.fail != "" {
		fmt.Fprintln(stderr, e.fail)
		return errors.New("command terminated with exit code 1")
	}
	defer close(e.ended)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	e.addr <- ln.Addr().String()
	done := make(chan error, 1)
	go func() { done <- tunnel.Pod(ln, stdin, stdout) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		// The real exec's stream closes; the pod side then sees its stdin end.
		return ctx.Err()
	}
}

func TestKubernetesAttachEgress(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, nil)
	ex := newTunnelExec()
	p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.BridgeImage = bridgeImage; c.Executor = ex })
	sb := sandboxtest.StartSpec(t, p, config.SandboxSpec{})
	ln, err := sb.(sandbox.Egress).AttachEgress(t.Context(), []byte("the job's CA"))
	if err != nil {
		t.Fatalf("AttachEgress: %v", err)
	}
	if got := ex.ca.String(); got != "the job's CA" {
		t.Errorf("CA written: %q", got)
	}
	if len(ex.tunnel) != 1 || !slices.Equal(ex.tunnel[0], []string{bridge.Path, tunnel.Arg}) {
		t.Errorf("tunnel exec: %q, want one of %s %s", ex.tunnel, bridge.Path, tunnel.Arg)
	}
	if !strings.Contains(sb.Info().Isolation, "egress=127.0.0.1:3128 tunnelled over pods/exec") {
		t.Errorf("isolation %q does not say egress", sb.Info().Isolation)
	}

	// A command's connection in the pod arrives on the listener, and the answer goes back.
	client2, err := net.Dial("tcp", <-ex.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer client2.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(client2, "CONNECT x:443 HTTP/1.1\r\n\r\n")
	buf := make([]byte, 8)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "CONNECT " {
		t.Errorf("worker side read %q, %v", buf, err)
	}
	c.Close()

	if _, err := sb.(sandbox.Egress).AttachEgress(t.Context(), nil); err == nil {
		t.Error("a second AttachEgress succeeded; a sandbox has one proxy")
	}
	// Closing the sandbox ends the tunnel's exec.
	if err := sb.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-ex.ended
	ln.Close()
}

func TestKubernetesAttachEgressTunnelFails(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, nil)
	ex := newTunnelExec()
	ex.fail = "exec /run/boxcar/bridge: no such file or directory"
	p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.BridgeImage = bridgeImage; c.Executor = ex })
	sb := sandboxtest.StartSpec(t, p, config.SandboxSpec{})
	_, err := sb.(sandbox.Egress).AttachEgress(t.Context(), []byte("ca"))
	if !errors.Is(err, tunnel.ErrNotReady) || !strings.Contains(err.Error(), "no such file") || !strings.Contains(err.Error(), bridgeImage) {
		t.Errorf("AttachEgress: %v, want ErrNotReady with what the pod said and the image", err)
	}
}

// TestKubernetesAttachEgressOverSession: a warm pod's egress goes over its command session (the
// CA written by the session itself, the tunnel's connections as streams of the session: no
// pods/exec at all); a warm pod whose bridge predates that, and a cold pod (no session), open
// the tunnel with its own exec. Either way the CA is there whole with mode 0644, a connection
// in the pod reaches the listener and its answer comes back, and closing the listener stops
// the pod's.
func TestKubernetesAttachEgressOverSession(t *testing.T) {
	for _, tt := range []struct {
		name      string
		pool      string
		oldBridge bool
		want      []string // what AttachEgress ran through pods/exec
		over      string   // what the manifest's isolation says carries the tunnel
	}{
		{name: "warm pod", pool: "p", over: "the pod's command session"},
		{name: "warm pod, older bridge", pool: "p", oldBridge: true, want: []string{"tunnel"}, over: "pods/exec"},
		{name: "cold pod", want: []string{"CA script", "tunnel"}, over: "pods/exec"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			fakeKubelet(t, client, nil)
			ex := &localExec{oldBridge: tt.oldBridge, addr: make(chan string, 2)}
			p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.BridgeImage = bridgeImage; c.Executor = ex })
			caFile := filepath.Join(t.TempDir(), "ca.pem")
			sandbox.SetPodCAFile(t, caFile)
			spec := sandbox.Spec{SandboxSpec: config.Profile{}.WithDefaults().Sandbox, Pool: tt.pool, Ahead: time.Minute}
			spec.Workdir = t.TempDir()
			if tt.pool == "" {
				spec.JobID = "job-cold"
			}
			sb, err := p.Start(t.Context(), spec)
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close(context.Background())
			if c, ok := sb.(sandbox.Claimer); ok && tt.pool != "" {
				if err := c.Claim(t.Context(), "default", "job-warm"); err != nil {
					t.Fatal(err)
				}
			}
			before := ex.count()
			ln, err := sb.(sandbox.Egress).AttachEgress(t.Context(), []byte("the job's CA"))
			if err != nil {
				t.Fatalf("AttachEgress: %v", err)
			}
			defer ln.Close()
			if got := ex.since(before, caFile); !slices.Equal(got, tt.want) {
				t.Errorf("AttachEgress ran %q through pods/exec, want %q", got, tt.want)
			}
			if want := "egress=127.0.0.1:3128 tunnelled over " + tt.over + " to"; !strings.Contains(sb.Info().Isolation, want) {
				t.Errorf("isolation %q does not say %q", sb.Info().Isolation, want)
			}
			if data, err := os.ReadFile(caFile); err != nil || string(data) != "the job's CA" {
				t.Errorf("CA written: %q, %v", data, err)
			}
			if fi, err := os.Stat(caFile); err != nil || fi.Mode().Perm() != 0o644 {
				t.Errorf("CA's mode: %v, %v; want 0644", fi.Mode().Perm(), err)
			}
			addr := <-ex.addr
			if got := roundTrip(t, addr, ln, "CONNECT x:443 HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK\r\n\r\n"); got != "HTTP/1.1 200 OK\r\n\r\n" {
				t.Errorf("the pod's client got %q back", got)
			}
			ln.Close()
			harness.Wait(t, "the pod's egress listener to stop", func() (bool, error) { return refused(addr), nil })
		})
	}
}

// roundTrip sends ask from a client of the pod's listener at addr, with a half close; the
// worker's side accepts it on ln, checks it read ask whole and answers. It returns what the
// client read back.
func roundTrip(t *testing.T, addr string, ln net.Listener, ask, answer string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, ask); err != nil {
		t.Fatal(err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	w, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(w)
	if err != nil || string(got) != ask {
		t.Errorf("the worker read %q, %v; want %q", got, err, ask)
	}
	_, _ = io.WriteString(w, answer)
	w.Close()
	back, err := io.ReadAll(c)
	if err != nil {
		t.Errorf("the client's read: %v", err)
	}
	return string(back)
}

// refused says whether a connection to addr is refused.
func refused(addr string) bool {
	c, err := net.Dial("tcp", addr)
	if err == nil {
		c.Close()
	}
	return err != nil
}
