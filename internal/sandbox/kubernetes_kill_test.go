package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// killExec stands in for pods/exec: a command runs until its stream's context ends, and the
// kill from outside that follows gets the answers the test gives, by round.
type killExec struct {
	started chan struct{} // receives once per command that began
	answer  func(pod string, round int) error

	mu    sync.Mutex
	kills int
}

func (e *killExec) Exec(ctx context.Context, _, pod string, argv []string, _ io.Reader, _, _ io.Writer) error {
	if len(argv) > 3 && argv[3] == "boxcar-kill" {
		e.mu.Lock()
		e.kills++
		round := e.kills
		e.mu.Unlock()
		return e.answer(pod, round)
	}
	e.started <- struct{}{}
	<-ctx.Done()
	return ctx.Err()
}

func (e *killExec) rounds() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.kills
}

// TestKubernetesKillStopsWhenThePodIsGone: the kill that follows a command whose caller gave
// up stops at the first answer saying the pod or its container is gone (it spent its whole
// grace, 100 rounds, failing), and keeps trying through what a fork bomb answers until a
// round succeeds.
func TestKubernetesKillStopsWhenThePodIsGone(t *testing.T) {
	t.Parallel()
	exitCode := func(code int) error {
		return utilexec.CodeExitError{Err: errors.New("command terminated with non-zero exit code"), Code: code}
	}
	tests := []struct {
		name       string
		answer     func(pod string) error
		wantRounds int
	}{
		{name: "pod deleted, a status", answer: func(pod string) error {
			return apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, pod)
		}, wantRounds: 1},
		{name: "pod deleted, over SPDY", answer: func(pod string) error {
			return fmt.Errorf("unable to upgrade connection: pods %q not found", pod)
		}, wantRounds: 1},
		{name: "pod gone from its node", answer: func(string) error {
			return errors.New("unable to upgrade connection: pod does not exist")
		}, wantRounds: 1},
		{name: "container terminated", answer: func(string) error {
			return errors.New(`unable to upgrade connection: container not found ("sandbox")`)
		}, wantRounds: 1},
		{name: "container stopped", answer: func(string) error {
			return errors.New(`Internal error occurred: error executing command in container: container is in CONTAINER_EXITED state`)
		}, wantRounds: 1},
		// A fork bomb: the script finds some of the tree still there, or the runtime finds no
		// process slot for its shell; the third round succeeds.
		{name: "fork bomb, tree left", answer: func(string) error { return exitCode(1) }, wantRounds: 3},
		{name: "fork bomb, exec cannot start", answer: func(string) error {
			return errors.New("Internal error occurred: error executing command in container: failed to exec in container: failed to start exec: OCI runtime exec failed: exec failed: unable to start container process: fork/exec /proc/self/exe: resource temporarily unavailable: unknown")
		}, wantRounds: 3},
		{name: "another pod not found", answer: func(string) error {
			return errors.New(`unable to upgrade connection: pods "someone-else" not found`)
		}, wantRounds: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ex := &killExec{started: make(chan struct{}, 1), answer: func(pod string, round int) error {
				if round == 3 {
					return nil
				}
				return tt.answer(pod)
			}}
			client := fake.NewClientset()
			fakeKubelet(t, client, nil)
			p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.Executor = ex })
			sb := sandboxtest.StartSpec(t, p, config.SandboxSpec{})

			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() {
				_, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "100"}})
				done <- err
			}()
			<-ex.started
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("Exec: err = %v, want context.Canceled", err)
			}
			if got := ex.rounds(); got != tt.wantRounds {
				t.Errorf("the kill from outside ran %d rounds, want %d", got, tt.wantRounds)
			}
		})
	}
}
