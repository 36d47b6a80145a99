package queue

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/redact"
)

// fetchFailureGrace is how long fetching may fail before the worker says it is not ready: a
// NATS server restarting or a leader changing is a blip no pod should be pulled for.
const fetchFailureGrace = 30 * time.Second

// fetchHealth is what a worker's readiness needs to know of its fetches: whether what it
// fetches from is there, and since when fetching fails.
type fetchHealth struct {
	mu sync.Mutex
	// gone names what redeclareIfGone found missing and could not set up again (the job
	// stream, a tenant's consumer); "" while all is there.
	gone string
	// failingSince is the first failure of the fetches failing now; zero while they work.
	failingSince time.Time
	why          string // the last failure, in words without an address
}

func (h *fetchHealth) fetched() {
	h.mu.Lock()
	h.failingSince, h.why = time.Time{}, ""
	h.mu.Unlock()
}

func (h *fetchHealth) failed(err error) {
	h.mu.Lock()
	if h.failingSince.IsZero() {
		h.failingSince = time.Now()
	}
	h.why = redact.ErrorWords(err)
	h.mu.Unlock()
}

func (h *fetchHealth) setGone(what string) {
	h.mu.Lock()
	h.gone = what
	h.mu.Unlock()
}

// FetchErr is nil while the worker can fetch jobs. Otherwise it says what keeps it from it:
// the job stream or a tenant's consumer gone from NATS and not set up again (at once: no
// fetch can succeed until `worker setup` runs), or fetches failing for fetchFailureGrace (a
// JetStream that does not answer). /readyz shows it: it names streams and consumers, never an
// address or a credential.
func (c *Consumer) FetchErr() error {
	h := &c.health
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.gone != "":
		return fmt.Errorf("%s is gone from NATS and was not set up again; run `worker setup` with an operator identity", h.gone)
	case !h.failingSince.IsZero() && time.Since(h.failingSince) >= fetchFailureGrace:
		return fmt.Errorf("fetching jobs fails since %s: %s", h.failingSince.UTC().Format(time.RFC3339), h.why)
	}
	return nil
}

// goneWhat names what err says is missing: the job stream, or the consumer of tenant.
func (c *Consumer) goneWhat(tenant string, err error) string {
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Sprintf("tenant %s's job stream %s", tenant, jobStream(c.cfg, tenant))
	}
	return fmt.Sprintf("tenant %s's consumer %s", tenant, consumerName(c.cfg, tenant))
}
