package sandboxtest

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"

	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// RunLost checks what every backend does with a sandbox that goes away from outside while a
// job uses it: lose takes it away as that backend's sandboxes are lost (a pod deleted or
// evicted, a workdir removed from the host), and then every call fails with
// sandbox.ErrSandboxLost (never a missing file, an empty listing or a result), as diskFull
// says, with sandbox.ErrDiskFull too; Close still succeeds.
func RunLost(t *testing.T, sb sandbox.Sandbox, lose func(t *testing.T), diskFull bool) {
	t.Helper()
	ctx := t.Context()
	if err := sb.WriteFile(ctx, "out/report.md", []byte("# half done\n")); err != nil {
		t.Fatalf("WriteFile before the loss: %v", err)
	}
	lose(t)
	calls := []struct {
		name string
		call func() error
	}{
		{"Exec", func() error {
			_, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}})
			return err
		}},
		{"ReadFile", func() error { _, err := sb.ReadFile(ctx, "out/report.md", 1<<20); return err }},
		{"Open", func() error {
			rc, err := sb.Open(ctx, "out/report.md", 1<<20)
			if err == nil {
				_, err = io.ReadAll(rc)
				rc.Close()
			}
			return err
		}},
		{"WriteFile", func() error { return sb.WriteFile(ctx, "out/more.md", []byte("x")) }},
		{"List", func() error { _, err := sb.List(ctx, "out"); return err }},
	}
	for _, c := range calls {
		err := c.call()
		if !errors.Is(err, sandbox.ErrSandboxLost) {
			t.Errorf("%s on a lost sandbox: %v; want an error wrapping ErrSandboxLost", c.name, err)
		}
		if got := errors.Is(err, sandbox.ErrDiskFull); got != diskFull {
			t.Errorf("%s on a lost sandbox: %v; wraps ErrDiskFull: %v, want %v", c.name, err, got, diskFull)
		}
	}
	if err := sb.Close(ctx); err != nil {
		t.Errorf("Close of a lost sandbox: %v", err)
	}
}

// LostExec plays pods/exec (sandbox.KubernetesConfig's Executor) for a pod that is lost once
// Answer is set: before, every script succeeds; after, every exec gets that answer (the API
// server's or the kubelet's word that the pod or its container is gone).
type LostExec struct{ Answer atomic.Pointer[error] }

func (e *LostExec) Exec(_ context.Context, _, _ string, _ []string, stdin io.Reader, _, _ io.Writer) error {
	if err := e.Answer.Load(); err != nil {
		return *err
	}
	if stdin != nil {
		_, _ = io.Copy(io.Discard, stdin)
	}
	return nil
}
