package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/pool"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/bridge"
	"github.com/boxcar-run/boxcar/internal/sandbox/tunnel"
	"github.com/boxcar-run/boxcar/test/harness"
)

// localExec plays pods/exec on this host: argv runs here, and the bridge's command session
// and egress tunnel are the real pod sides (tunnel.ServeCommands, tunnel.Pod), which listen for
// egress on the test's loopback and send where on addr. It records every exec.
type localExec struct {
	// oldBridge has the command session refuse egress, as a bridge that predates egress over
	// the session does.
	oldBridge bool
	addr      chan string

	mu    sync.Mutex
	execs [][]string
}

// listen is the pod sides' egress listener: the test's loopback instead of bridge.ListenAddr.
func (e *localExec) listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err == nil && e.addr != nil {
		e.addr <- ln.Addr().String()
	}
	return ln, err
}

// bridge runs the bridge's pod side for argv until it ends or ctx does.
func (e *localExec) bridge(ctx context.Context, argv []string, stdin io.Reader, stdout io.Writer) error {
	done := make(chan error, 1)
	switch {
	case slices.Equal(argv, []string{bridge.Path, tunnel.CommandsArg}):
		listen := e.listen
		if e.oldBridge {
			listen = nil
		}
		go func() { done <- tunnel.ServeCommands(stdin, stdout, listen) }()
	case slices.Equal(argv, []string{bridge.Path, tunnel.Arg}):
		ln, err := e.listen()
		if err != nil {
			return err
		}
		go func() { done <- tunnel.Pod(ln, stdin, stdout) }()
	default:
		return fmt.Errorf("this test's bridge does not know %q", argv)
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (e *localExec) Exec(ctx context.Context, _, _ string, argv []string, stdin io.Reader, stdout, stderr io.Writer) error {
	e.mu.Lock()
	e.execs = append(e.execs, argv)
	e.mu.Unlock()
	if argv[0] == bridge.Path {
		return e.bridge(ctx, argv, stdin, stdout)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	err := cmd.Run()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		return utilexec.CodeExitError{Err: err, Code: ee.ExitCode()}
	}
	return err
}

func (e *localExec) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.execs)
}

// TestKubernetesWarmPodCommandSession: a warm pod opens its command session while it waits, and
// its job's file transfers and commands then run over it: one pods/exec in all, however many
// calls, each with the same result as through pods/exec. A cold pod has no session: one exec
// per call.
func TestKubernetesWarmPodCommandSession(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, nil)
	ex := &localExec{}
	p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.BridgeImage = bridgeImage; c.Executor = ex })
	job := func(t *testing.T, pool string) int {
		spec := sandbox.Spec{SandboxSpec: config.Profile{}.WithDefaults().Sandbox, Pool: pool, Ahead: time.Minute}
		spec.Workdir = t.TempDir() // the commands run on this host
		if pool == "" {
			spec.JobID = "job-cold"
		}
		sb, err := p.Start(t.Context(), spec)
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Close(context.Background())
		if c, ok := sb.(sandbox.Claimer); ok && pool != "" {
			if err := c.Claim(t.Context(), "default", "job-warm"); err != nil {
				t.Fatal(err)
			}
		}
		before := ex.count()
		if err := sb.WriteFile(t.Context(), "in/a.csv", []byte("a,b\n1,2\n")); err != nil {
			t.Fatal(err)
		}
		if data, err := sb.ReadFile(t.Context(), "in/a.csv", 1<<10); err != nil || string(data) != "a,b\n1,2\n" {
			t.Errorf("ReadFile = %q, %v", data, err)
		}
		res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sh", "-c", `cat in/a.csv; echo "$JOB" >&2; exit 4`},
			Env: map[string]string{"JOB": "j1"}, Timeout: time.Minute})
		if err != nil || res.ExitCode != 4 || string(res.Stdout) != "a,b\n1,2\n" || string(res.Stderr) != "j1\n" {
			t.Errorf("Exec = %+v (stdout %q, stderr %q), %v; want exit 4 with the file and the env apart", res, res.Stdout, res.Stderr, err)
		}
		if _, err := sb.ReadFile(t.Context(), "../etc/passwd", 1<<10); !errors.Is(err, sandbox.ErrPathEscape) {
			t.Errorf("ReadFile out of the workdir: %v, want ErrPathEscape", err)
		}
		return ex.count() - before
	}
	if n := job(t, "p"); n != 0 {
		t.Errorf("a warm pod's job made %d pods/exec calls, want none: its session carries them", n)
	}
	if n := job(t, ""); n != 3 {
		t.Errorf("a cold pod's job made %d pods/exec calls, want 3 (write, read, exec; the refused path ends before an exec)", n)
	}
}

type noPoolLag struct{}

func (noPoolLag) Lags(context.Context) ([]pool.Lag, error) { return nil, nil }

// TestKubernetesPoolCloseLeavesTakenPods: a warm pod a job took keeps its command session
// when the pool closes (the worker drains while the job runs). The session was opened on the
// context of the pool's start, which ends with the start and which Close cancels besides; the
// job's commands still run over it, none through pods/exec, and the sandbox's Close ends it
// (goleak, TestMain). Opened on that context itself, the session was gone once the start ended.
func TestKubernetesPoolCloseLeavesTakenPods(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, nil)
	ex := &localExec{}
	p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.BridgeImage = bridgeImage; c.Executor = ex })
	prof := config.Profile{Warm: &config.Warm{Min: 1, Max: 1, Idle: config.Duration(time.Hour), MaxAge: config.Duration(time.Hour)}}.WithDefaults()
	prof.Sandbox.Workdir = t.TempDir() // the commands run on this host
	m := pool.NewMetrics(nil)
	pl, err := pool.New(pool.Config{Provider: p, Profiles: map[string]config.Profile{"p": prof}, Slots: 2, Lag: noPoolLag{},
		Metrics: m, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	pl.Reconcile(t.Context())
	harness.Wait(t, "the pool's pod ready", func() (bool, error) { return testutil.ToFloat64(m.Size.WithLabelValues("p")) == 1, nil })
	sb, warm, err := pl.Take(t.Context(), "default", "p", "job-1", sandbox.Spec{JobID: "job-1", Tenant: "default", SandboxSpec: prof.Sandbox})
	if err != nil || !warm {
		t.Fatalf("Take = warm %v, %v; want the warm pod", warm, err)
	}
	pl.Close()
	before := ex.count()
	if err := sb.WriteFile(t.Context(), "in.txt", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"cat", "in.txt"}, Timeout: time.Minute}); err != nil || string(res.Stdout) != "x" {
		t.Errorf("Exec after the pool closed = %q, %v", res.Stdout, err)
	}
	if n := ex.count() - before; n != 0 {
		t.Errorf("the job made %d pods/exec calls after the pool closed, want none: its session carries them", n)
	}
	if err := sb.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestKubernetesWarmClaimOffPath: a warm pod whose command session answers is claimed without
// waiting for the claim's patch: the job's input and first command run while the patch is
// still held by the API server, and Close waits for it. The patch still names the job and
// shortens the deadline, and the sandbox's isolation says the new deadline.
func TestKubernetesWarmClaimOffPath(t *testing.T) {
	client := fake.NewClientset()
	fakeKubelet(t, client, nil)
	claimReturned := make(chan struct{})
	var patched atomic.Bool
	var patch []byte
	client.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		select { // held until Claim returns; the bound only keeps a Claim that waits from hanging
		case <-claimReturned:
		case <-time.After(30 * time.Second):
		}
		patch = a.(k8stesting.PatchAction).GetPatch()
		patched.Store(true)
		return false, nil, nil
	})
	p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.BridgeImage = bridgeImage; c.Executor = &localExec{} })
	spec := sandbox.Spec{SandboxSpec: config.Profile{}.WithDefaults().Sandbox, Pool: "p", Ahead: time.Hour}
	spec.Lifetime = config.Duration(20 * time.Minute)
	spec.Workdir = t.TempDir()
	sb, err := p.Start(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	err = sb.(sandbox.Claimer).Claim(t.Context(), "default", "job-7")
	waited := patched.Load()
	close(claimReturned)
	if err != nil || waited {
		t.Fatalf("Claim = %v, after its patch: %v; want nil before it", err, waited)
	}
	if err := sb.WriteFile(t.Context(), "input.csv", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"cat", "input.csv"}, Timeout: time.Minute}); err != nil || string(res.Stdout) != "x" {
		t.Errorf("Exec = %q, %v", res.Stdout, err)
	}
	if iso := sb.Info().Isolation; !strings.Contains(iso, "active_deadline=120") {
		t.Errorf("isolation %q; want the claim's deadline, about 1200 s", iso)
	}
	if err := sb.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !patched.Load() || !strings.Contains(string(patch), `"job-7"`) || !strings.Contains(string(patch), `"activeDeadlineSeconds":120`) {
		t.Errorf("after Close: patched %v, patch %s; want the job and the deadline patched before Close returns", patched.Load(), patch)
	}
}

// since names the execs made after the first n: the CA's script (writing caFile), the
// egress tunnel, or the argv.
func (e *localExec) since(n int, caFile string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var names []string
	for _, argv := range e.execs[n:] {
		switch {
		case argv[0] == "sh" && argv[len(argv)-1] == caFile:
			names = append(names, "CA script")
		case slices.Equal(argv, []string{bridge.Path, tunnel.Arg}):
			names = append(names, "tunnel")
		default:
			names = append(names, strings.Join(argv, " "))
		}
	}
	return names
}
