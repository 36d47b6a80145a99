//go:build integration

package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/pool"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

func auditFDs() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	return len(ents)
}

func auditGoroutines() int {
	n := runtime.NumGoroutine()
	for range 40 {
		time.Sleep(50 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m >= n {
			return m
		}
		n = m
	}
	return n
}

// auditSandboxLife runs one sandbox through what a job does to it, ending the way kind says.
func auditSandboxLife(t *testing.T, p *sandbox.BubblewrapProvider, kind int) {
	t.Helper()
	ctx := t.Context()
	spec := sandboxtest.Spec(fmt.Sprintf("job-%d", kind), config.SandboxSpec{})
	if kind%4 == 3 {
		spec.Lifetime = config.Duration(700 * time.Millisecond)
	}
	sb, err := p.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "in/a.txt", []byte("x")); err != nil {
		t.Fatal(err)
	}
	ln, err := sb.(sandbox.Egress).AttachEgress(ctx, []byte("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n"))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	defer ln.Close()
	_, _ = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo hi; curl -s --max-time 2 -x http://" + sandbox.EgressAddr + " http://a.test/ || true"}, Timeout: 10 * time.Second})
	switch kind % 4 {
	case 0: // a command that times out
		_, _ = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "sleep 30 & sleep 30"}, Timeout: 200 * time.Millisecond})
	case 1: // a cancel mid-command
		cctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(200*time.Millisecond, cancel)
		_, _ = sb.Exec(cctx, sandbox.ExecRequest{Argv: []string{"sleep", "30"}})
	case 2: // Close while a command runs
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "30"}})
		}()
		time.Sleep(200 * time.Millisecond)
		_ = sb.Close(ctx)
		<-done
	case 3: // its lifetime passes mid-command
		_, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "30"}})
		if !errors.Is(err, sandbox.ErrClosed) {
			t.Errorf("exec across the lifetime: %v", err)
		}
	}
	if err := sb.Close(ctx); err != nil {
		t.Errorf("close: %v", err)
	}
}

// TestAuditGrowthBubblewrapManySandboxes: sandboxes that end every way (a timeout, a cancel,
// Close mid-command, their lifetime) leave the worker where it was: no goroutine, no fd, no
// entry of Root.
func TestAuditSoundGrowthBubblewrapManySandboxes(t *testing.T) {
	root := sandboxtest.SearchableTempDir(t)
	p := sandboxtest.Bubblewrap(t, func(c *sandbox.BubblewrapConfig) { c.Root = root })
	for i := range 4 {
		auditSandboxLife(t, p, i)
	}
	g0, f0 := auditGoroutines(), auditFDs()
	e0, _ := os.ReadDir(root)
	for i := range 16 {
		auditSandboxLife(t, p, i)
	}
	g1, f1 := auditGoroutines(), auditFDs()
	e1, _ := os.ReadDir(root)
	t.Logf("goroutines %d -> %d, fds %d -> %d, root entries %d -> %d", g0, g1, f0, f1, len(e0), len(e1))
	if g1 > g0+2 || f1 > f0+2 || len(e1) > len(e0) {
		var names []string
		for _, e := range e1 {
			names = append(names, e.Name())
		}
		buf := make([]byte, 1<<20)
		t.Errorf("after 16 more sandboxes: goroutines %d -> %d, fds %d -> %d, root %v\n%s", g0, g1, f0, f1, names, buf[:runtime.Stack(buf, true)])
	}
	_ = net.ErrClosed
}

type auditLag struct{}

func (auditLag) Lags(context.Context) ([]pool.Lag, error) {
	return []pool.Lag{{Tenant: "t", Pending: 1}}, nil
}

// auditChildren counts the processes whose parent is this one (bwrap and spares).
func auditChildren() int {
	self := fmt.Sprint(os.Getpid())
	n := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(data)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == self {
			n++
		}
	}
	return n
}

// TestAuditGrowthWarmPoolManyTakes: a warm pool kept full while jobs take its sandboxes, some
// running commands (the spare used), some none (the spare discarded), some timed out, some
// closed mid-command; between takes the worker's goroutines, fds, child processes and Root
// stay where they were.
func TestAuditSoundGrowthWarmPoolManyTakes(t *testing.T) {
	root := sandboxtest.SearchableTempDir(t)
	p := sandboxtest.Bubblewrap(t, func(c *sandbox.BubblewrapConfig) { c.Root = root })
	prof := config.Profile{Sandbox: sandboxtest.Spec("warm", config.SandboxSpec{}).SandboxSpec, Warm: &config.Warm{Min: 1, Max: 1, Idle: config.Duration(time.Hour), MaxAge: config.Duration(time.Hour)}}
	pl, err := pool.New(pool.Config{Provider: p, Profiles: map[string]config.Profile{"warm": prof}, Slots: 2, Lag: auditLag{},
		Metrics: pool.NewMetrics(nil), Logger: slog.New(slog.DiscardHandler), Interval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); _ = pl.Run(ctx) }()
	defer func() { cancel(); <-done; pl.Close() }()

	warmTakes := 0
	take := func(i int) {
		spec := sandboxtest.Spec(fmt.Sprintf("job-%d", i), config.SandboxSpec{})
		sb, warm, err := pl.Take(ctx, "t", "warm", spec.JobID, spec)
		if err != nil {
			t.Fatal(err)
		}
		if warm {
			warmTakes++
		}
		switch i % 4 {
		case 0:
			_, _ = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}})
		case 1: // no command: the spare is discarded
		case 2:
			_, _ = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "30"}, Timeout: 200 * time.Millisecond})
		case 3:
			go func() { time.Sleep(200 * time.Millisecond); _ = sb.Close(ctx) }()
			_, _ = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "30"}})
		}
		if err := sb.Close(ctx); err != nil {
			t.Error(err)
		}
	}
	settle := func() (int, int, int, int) {
		time.Sleep(time.Second) // the pool's replacement warms up
		ents, _ := os.ReadDir(root)
		return auditGoroutines(), auditFDs(), auditChildren(), len(ents)
	}
	for i := range 4 {
		take(i)
	}
	g0, f0, c0, r0 := settle()
	for i := range 16 {
		take(i)
	}
	g1, f1, c1, r1 := settle()
	t.Logf("%d of 20 takes warm", warmTakes)
	t.Logf("goroutines %d -> %d, fds %d -> %d, children %d -> %d, root entries %d -> %d", g0, g1, f0, f1, c0, c1, r0, r1)
	if g1 > g0+3 || f1 > f0+3 || c1 > c0 || r1 > r0 {
		buf := make([]byte, 1<<20)
		t.Errorf("after 16 more takes: goroutines %d -> %d, fds %d -> %d, children %d -> %d, root entries %d -> %d\n%s", g0, g1, f0, f1, c0, c1, r0, r1, buf[:runtime.Stack(buf, true)])
	}
}
