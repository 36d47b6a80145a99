package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// forgedFile answers every file script in the pod with one failure the script reports
// (fileReasons, or an errno's text), whatever the operation: what runs in the pod, the job's
// processes among it, can say anything there.
type forgedFile struct{ reason string }

func (f forgedFile) Exec(_ context.Context, _, _ string, argv []string, _ io.Reader, _, stderr io.Writer) error {
	if len(argv) < 6 || argv[3] != "boxcar-file" {
		return errors.New("this test answers only file scripts")
	}
	fmt.Fprintf(stderr, "boxcar-%s: %s\n", argv[5], f.reason)
	return utilexec.CodeExitError{Err: errors.New("command terminated with exit code 125"), Code: 125}
}

// TestKubernetesFileAnswersAnyOperation: every failure a pod's file script can report is an
// error of whichever operation it answers, never a panic of the worker's. "toolarge" named
// the bound from the operation's arguments, which a write and a list have none of: a write
// answered so crashed the worker (index out of range).
func TestKubernetesFileAnswersAnyOperation(t *testing.T) {
	t.Parallel()
	ops := map[string]func(context.Context, sandbox.Sandbox) error{
		"read":  func(ctx context.Context, sb sandbox.Sandbox) error { _, err := sb.ReadFile(ctx, "f", 10); return err },
		"open":  func(ctx context.Context, sb sandbox.Sandbox) error { _, err := sb.Open(ctx, "f", 10); return err },
		"list":  func(ctx context.Context, sb sandbox.Sandbox) error { _, err := sb.List(ctx, "d"); return err },
		"write": func(ctx context.Context, sb sandbox.Sandbox) error { return sb.WriteFile(ctx, "f", []byte("x")) },
	}
	reasons := []string{"notfound", "escape", "toolarge", "isdir", "notdir", "notregular", "denied", "ioerror", "os: No such file or directory", "os: gibberish", ""}
	for _, reason := range reasons {
		t.Run(reason, func(t *testing.T) {
			t.Parallel()
			client := fake.NewClientset()
			fakeKubelet(t, client, nil)
			p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.Executor = forgedFile{reason: reason} })
			sb := sandboxtest.StartSpec(t, p, config.SandboxSpec{})
			for op, do := range ops {
				func() {
					defer func() {
						if r := recover(); r != nil {
							t.Errorf("%s answered %q: panic: %v", op, reason, r)
						}
					}()
					if err := do(t.Context(), sb); err == nil {
						t.Errorf("%s answered %q: no error", op, reason)
					}
				}()
			}
		})
	}
}
