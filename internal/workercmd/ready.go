package workercmd

import (
	"context"
	"errors"
	"strings"

	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/modelgate"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
)

// sandboxChecker is a provider that can tell whether it could start a sandbox now (the cluster
// answers, the runtime is there). Providers without it are usable once constructed.
type sandboxChecker interface {
	Check(ctx context.Context) error
}

// readyProbeKey is an input key that never exists: looking it up proves the store answers and
// the worker may read inputs, without writing anything.
var readyProbeKey = store.InputKey(strings.Repeat("0", 64))

// readiness is what /readyz reports: not draining, connected to NATS, able to fetch jobs (the
// job stream and its consumers there, fetches not failing for long), the model endpoint up
// (its circuit breaker closed), the store reachable and the sandbox provider usable. The
// cheap local checks come first.
func readiness(r *runner.Runner, link *queue.Link, q *queue.Consumer, st store.Store, sandboxes sandbox.Provider, model *modelgate.Gate) metrics.Ready {
	return metrics.AllReady(
		metrics.Check{Name: "worker", Func: func(context.Context) error {
			if r.Draining() {
				return errors.New("draining")
			}
			return nil
		}},
		metrics.Check{Name: "nats", Func: func(context.Context) error { return link.Err() }},
		metrics.Check{Name: "jobs", Func: func(context.Context) error { return q.FetchErr() }},
		metrics.Check{Name: "model", Func: func(context.Context) error { return model.Err() }},
		metrics.Check{Name: "store", Func: func(ctx context.Context) error { return storeReady(ctx, st) }},
		metrics.Check{Name: "sandbox " + sandboxes.Backend(), Func: func(ctx context.Context) error {
			if c, ok := sandboxes.(sandboxChecker); ok {
				return c.Check(ctx)
			}
			return nil
		}},
	)
}
