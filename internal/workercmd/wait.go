package workercmd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/backoff"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/store"
)

// starting is the worker's readiness before it takes jobs: what it is waiting for, until the
// full checks take over.
type starting struct {
	link *queue.Link

	mu   sync.Mutex
	why  error         // what the worker waits for now
	full metrics.Ready // the checks of a running worker, once it runs
}

func (s *starting) set(why error, full metrics.Ready) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.why, s.full = why, full
}

// ready is what /readyz reports from the first moment: NATS first, as the link knows at once
// whether it is connected, then what the start-up waits for, then the full checks.
func (s *starting) ready(ctx context.Context) error {
	if err := s.link.Err(); err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	s.mu.Lock()
	why, full := s.why, s.full
	s.mu.Unlock()
	switch {
	case full != nil:
		return full(ctx)
	case why != nil:
		return why
	}
	return errors.New("starting")
}

// tryTimeout bounds one try of a dependency during start-up.
const tryTimeout = 10 * time.Second

// await runs try until it succeeds, pausing with backoff between tries, and meanwhile says on
// /readyz what it waits for. It logs once when the wait begins and once when it ends (each
// retry only at debug level, and nothing while NATS is down, which the link logs itself). An
// error fatal says no retry can fix ends the wait, as does ctx.
func await(ctx context.Context, log *slog.Logger, s *starting, what string, try func(context.Context) error, fatal func(error) bool) error {
	waiting := false
	s.set(fmt.Errorf("%s: not checked yet", what), nil)
	for round := 1; ; round++ {
		tctx, cancel := context.WithTimeout(ctx, tryTimeout)
		err := try(tctx)
		cancel()
		switch {
		case err == nil:
			s.set(nil, nil)
			if waiting {
				log.Info(what+" answers; done waiting", "tries", round)
			}
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case fatal(err):
			return err
		}
		err = fmt.Errorf("%s: %w", what, err)
		s.set(err, nil)
		switch {
		case s.link.Err() != nil:
			// NATS is down: the link logs that, and /readyz names it first.
		case waiting:
			log.Debug("still waiting for "+what, "error", err)
		default:
			waiting = true
			log.Warn("waiting for "+what+" (retrying with backoff; /readyz says why)", "error", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff.Delay(round)):
		}
	}
}

// awaitQueue waits until NATS answers and the job stream, consumers and buckets are set up (or,
// for an identity that may not declare them, bound).
// While the link is down it only waits for it (the link logs that); an error JetStream answers
// with, other than "temporarily unavailable", is a setting no retry fixes and stops the worker.
func awaitQueue(ctx context.Context, log *slog.Logger, s *starting, cfg config.NATS, tenants map[string]config.Tenant) (*queue.Consumer, error) {
	var q *queue.Consumer
	err := await(ctx, log, s, "the job stream", func(ctx context.Context) error {
		for s.link.Err() != nil {
			select {
			case <-ctx.Done():
				return s.link.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
		var err error
		q, err = queue.Open(ctx, s.link.Conn(), cfg, tenants, log)
		if noPeers(err) {
			err = fmt.Errorf("%w (nats.replicas is %d: JetStream places each stream and bucket on that many servers, and fewer are up; waiting for them)", err, cfg.Replicas)
		}
		return err
	}, queueFatal)
	return q, err
}

// jsNoPeers is JetStream's "no suitable peers for placement": a 400, though a cluster answers
// it while a server is down or the cluster still forms, which a rolling restart makes routine.
const jsNoPeers = 10005

func noPeers(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && api.ErrorCode == jsNoPeers
}

// queueFatal says a start error no wait can fix: a stream, consumer or bucket missing for a
// worker that may not declare them (the error says to run `worker setup`), or a JetStream
// answer other than "temporarily unavailable" or "no peers for now" (a setting).
func queueFatal(err error) bool {
	var api *jetstream.APIError
	return errors.Is(err, queue.ErrNotReady) || errors.As(err, &api) && api.Code != 503 && !noPeers(err)
}

// awaitRootLayout waits until the runner has moved what workers before tenants left at the
// store's root into tenant default's folder (runner.AdoptRootLayout), before the worker says it
// is ready: a store that stops answering meanwhile is waited for, as at start. A try cut short
// keeps what it moved, so a large root takes several.
func awaitRootLayout(ctx context.Context, log *slog.Logger, s *starting, r *runner.Runner) error {
	return await(ctx, log, s, "the store's layout before tenants moved", r.AdoptRootLayout, func(error) bool { return false })
}

// awaitStore waits until the store answers; a server that would let a stale attempt overwrite
// a committed run stops the worker.
func awaitStore(ctx context.Context, log *slog.Logger, s *starting, st store.Store) error {
	return await(ctx, log, s, "store", func(ctx context.Context) error {
		return storeReady(ctx, st)
	}, func(err error) bool { return errors.Is(err, store.ErrUnsafeServer) })
}

// storeReady proves that the server refuses a second create-only put (one refused PUT a minute
// at most), and that the worker may read inputs, writing nothing else. The put comes first:
// its refusal names its cause and what to change (a wrong key, a bucket gone), where a HEAD's
// has no body and says only "Forbidden".
func storeReady(ctx context.Context, st store.Store) error {
	if err := store.Probe(ctx, st); err != nil {
		return err
	}
	if _, err := st.Stat(ctx, readyProbeKey); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	return nil
}
