package runner

import (
	"context"
	"time"
)

// ModelGate is the model endpoint's circuit breaker as the fetch loop sees it
// (internal/modelgate's Gate is one). Jobs in flight wait on it inside the agent.
type ModelGate interface {
	// Up reports whether model requests pass.
	Up() bool
	// Wait returns when they do, or with ctx's cause.
	Wait(ctx context.Context) error
}

// awaitModel holds the fetch loop while the model endpoint is down: a job fetched now could
// only wait in its slot, and each of the jobs left in the queue keeps its deliveries for when
// the endpoint is back. Jobs in flight wait in the agent, their deliveries kept alive. A fetch
// already waiting when the breaker opened is left to end: cancelling a pull can lose a message
// already on its way, which would then wait out AckWait and spend a delivery.
func (r *Runner) awaitModel(ctx context.Context) {
	g := r.cfg.ModelGate
	if g == nil || g.Up() {
		return
	}
	start := time.Now()
	r.log.WarnContext(ctx, "model endpoint down; fetching no jobs until it answers")
	if g.Wait(ctx) == nil {
		r.log.InfoContext(ctx, "model endpoint answers; fetching jobs again", "waited_ms", time.Since(start).Milliseconds())
	}
}
