package cluster_test

import (
	"bufio"
	"bytes"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// toolsImage is the sandbox image of the egress tests: busybox with the host's curl, Python
// and pip, the clients the suite drives.
const toolsImage = "boxcar.test/egress-tools:1"

// TestEgress runs the egress conformance suite (sandboxtest.RunEgress) on real pods: the
// worker's proxy in this process, each pod's tunnel over pods/exec from the release image's
// binary (bridge_image, copied in by the pod's init container), the upstreams in a network
// namespace of this test's at a 198.18.0.0/15 address on the host, which the node's pods
// cannot route to: a sandbox pod has no route at all (TestContainment), so its one way out is
// the tunnel, whether or not a NetworkPolicy is enforced (it is not, here).
func TestEgress(t *testing.T) {
	ns := sandboxNamespace(t)
	release, _ := importReleaseImage(t)
	importToolsImage(t)
	p := egressProvider(t, ns, release)
	sandboxtest.RunEgress(t, p)
	// The suite closes its sandbox in a cleanup; closed here first (Close is idempotent), the
	// pod and its containers, the tunnel's included, must be gone.
	for _, sb := range p.started {
		if err := sb.Close(t.Context()); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	noSandboxLeft(t, ns)
}

// TestEgressWarm runs the egress suite on a warm pod (a pool's, claimed, with a neighbour
// beside it) with the bridge: its CA written by the pod's command session itself and its
// tunnel carried as streams of that session, without an exec of their own.
func TestEgressWarm(t *testing.T) {
	ns := sandboxNamespace(t)
	release, _ := importReleaseImage(t)
	importToolsImage(t)
	sandboxtest.RunEgress(t, sandboxtest.Warm(t, egressProvider(t, ns, release)))
}

// egressProvider is the backend as the chart sets it up: the worker's image as the bridge
// image, the tools image for sandboxes.
func egressProvider(t *testing.T, ns, release string) *halfCPU {
	t.Helper()
	p, err := sandbox.NewKubernetes(sandbox.KubernetesConfig{
		Client:          kube.Client,
		RESTConfig:      kube.RESTConfig,
		Namespace:       ns,
		Image:           toolsImage,
		BridgeImage:     release,
		ImagePullPolicy: corev1.PullNever,
		WorkerID:        "egress",
		StartTimeout:    2 * time.Minute,
	})
	if err != nil {
		t.Fatalf("NewKubernetes: %v", err)
	}
	return &halfCPU{KubernetesProvider: p}
}

// halfCPU asks for half a CPU where a spec has the default of one (the node has two, and the
// cluster's own pods request some), and keeps the sandboxes it started.
type halfCPU struct {
	*sandbox.KubernetesProvider
	mu      sync.Mutex // a pool starts its sandboxes beside the test's
	started []sandbox.Sandbox
}

func (p *halfCPU) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if spec.CPU == "1" { // the profiles' default
		spec.CPU = "500m"
	}
	sb, err := p.KubernetesProvider.Start(ctx, spec)
	if err == nil {
		p.mu.Lock()
		p.started = append(p.started, sb)
		p.mu.Unlock()
	}
	return sb, err
}

// importToolsImage imports toolsImage: curl, python3.11 with its standard library and pip,
// getent, and every library they and Python's extension modules load, as the host has them.
func importToolsImage(t testing.TB) {
	t.Helper()
	files := map[string]string{}
	for _, prog := range []string{"/usr/bin/curl", "/usr/bin/python3.11", "/usr/bin/getent"} {
		files[prog] = prog
	}
	for _, tree := range []string{"/usr/lib/python3.11", "/usr/lib/python3/dist-packages/pip"} {
		err := filepath.WalkDir(tree, func(path string, d fs.DirEntry, err error) error {
			switch {
			case err != nil:
				return err
			case d.IsDir() && (d.Name() == "test" || d.Name() == "idlelib" || d.Name() == "tkinter"):
				return filepath.SkipDir
			case d.IsDir():
				return nil
			}
			if _, err := os.Stat(path); err == nil { // a dangling link is left out
				files[path] = path
			}
			return nil
		})
		if err != nil {
			t.Fatalf("tools image: %v", err)
		}
	}
	libs := map[string]string{}
	for name := range files {
		if strings.HasPrefix(name, "/usr/bin/") || strings.HasSuffix(name, ".so") {
			for _, lib := range sharedLibs(t, name) {
				libs[lib] = lib
			}
		}
	}
	for k, v := range libs {
		files[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := kube.ImportBusyboxImage(ctx, toolsImage, files, map[string]string{"/usr/bin/python3": "python3.11"}); err != nil {
		t.Fatal(err)
	}
}

// sharedLibs are the paths ldd names for a program or library, the loader included.
func sharedLibs(t testing.TB, path string) []string {
	t.Helper()
	out, err := exec.Command("ldd", path).Output()
	if err != nil {
		if bytes.Contains(out, []byte("not a dynamic executable")) || len(out) == 0 {
			return nil
		}
		t.Fatalf("ldd %s: %v: %s", path, err, out)
	}
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		for _, f := range strings.Fields(sc.Text()) {
			if strings.HasPrefix(f, "/") {
				libs = append(libs, f)
			}
		}
	}
	return libs
}
