package runner

import (
	"context"
	"errors"

	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// takenSandbox is what a start or a pool's take gave the attempt.
type takenSandbox struct {
	sb   sandbox.Sandbox
	warm bool
}

// startWhenAvailable runs start until the backend takes a sandbox or refuses it for another
// reason than being unavailable: an outage of the backend is not the job's fault, so the
// attempt waits (awaitAnswer: its delivery kept, up to when the job must start), and the fetch
// loop takes no job meanwhile (fetchHolds).
func (r *Runner) startWhenAvailable(ctx context.Context, a *attempt, start func(context.Context) (takenSandbox, error)) (takenSandbox, error) {
	return awaitAnswer(ctx, r, a, "the sandbox backend", func(err error) bool {
		return !errors.Is(err, sandbox.ErrUnavailable)
	}, start)
}
