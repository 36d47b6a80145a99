package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
)

// `worker setup` retires a tenant its config does not list (retireUnserved) and records that it
// did in the shared job stream's metadata (nats.stream, which takes no job: drain.go),
// boxcar.retired.T, with the time: a worker reads the stream's info at start (every worker
// identity may), so the record needs no grant of its own; it outlives the tenant's own stream,
// which setup removes once its jobs ended, and it survives every update of the stream. A worker
// whose tenants: still lists a retired tenant (a config not rolled out everywhere yet) honours
// the record: it declares neither the tenant's subject nor its consumer, and says so once.
// Setup with a config that lists the tenant clears the record. A worker that cannot read the
// record serves its tenants: as before, and says so.

// ReasonTenantRetired is the dead letter's reason for a job of a retired tenant that was left
// to its run and whose worker died (endRetired).
const ReasonTenantRetired = "tenant_retired"

const retiredPrefix = "boxcar.retired."

// reasonMaxDeliveries is the runner's reason for the letter of a job that ended dead.
const reasonMaxDeliveries = "max_deliveries"

// retiredIn returns the tenants the job stream's metadata records as retired.
func retiredIn(cfg jetstream.StreamConfig) map[string]bool {
	out := map[string]bool{}
	for key := range cfg.Metadata {
		if tenant, ok := strings.CutPrefix(key, retiredPrefix); ok {
			out[tenant] = true
		}
	}
	return out
}

// subjectTenants returns the tenants whose jobs the job stream's subjects take.
func subjectTenants(cfg config.NATS, subjects []string) []string {
	var out []string
	for _, subject := range subjects {
		tenant, ok := strings.CutPrefix(subject, cfg.Subject+".")
		tenant, ok2 := strings.CutSuffix(tenant, ".*")
		if ok && ok2 && job.ValidTenant(tenant) {
			out = append(out, tenant)
		}
	}
	return out
}

// recordRetired is setup's: it records every tenant the job streams take or the record had
// that the config does not list, and clears the record of those it lists. It runs before the
// tenants' jobs and consumers are retired, so that a worker of the old config that starts
// meanwhile already finds the record.
func (a *Admin) recordRetired(ctx context.Context) error {
	streams, err := a.jobStreams(ctx)
	if err != nil {
		return err
	}
	s, err := a.sharedStream(ctx)
	if err != nil {
		return err
	}
	cur := s.CachedInfo().Config
	next := cur
	next.Metadata = maps.Clone(cur.Metadata)
	if next.Metadata == nil {
		next.Metadata = map[string]string{}
	}
	var retired, cleared []string
	for tenant := range retiredIn(cur) {
		if _, ok := a.tenants[tenant]; ok {
			delete(next.Metadata, retiredPrefix+tenant)
			cleared = append(cleared, tenant)
		}
	}
	for _, tenant := range takenTenants(a.cfg, streams) {
		if _, ok := a.tenants[tenant]; !ok && next.Metadata[retiredPrefix+tenant] == "" {
			next.Metadata[retiredPrefix+tenant] = time.Now().UTC().Format(time.RFC3339)
			retired = append(retired, tenant)
		}
	}
	if len(retired) == 0 && len(cleared) == 0 {
		return nil
	}
	if _, err := a.js.UpdateStream(ctx, next); err != nil {
		return fmt.Errorf("queue: record the retired tenants in stream %s: %w", a.cfg.Stream, err)
	}
	a.log.InfoContext(ctx, "recorded the tenants the config retires, and cleared those it lists again; workers whose tenants: still lists a retired tenant leave it out",
		"stream", a.cfg.Stream, "retired", slices.Sorted(slices.Values(retired)), "cleared", slices.Sorted(slices.Values(cleared)))
	return nil
}

// readRetired returns the tenants the job stream records as retired: none when there is no
// stream yet.
func readRetired(ctx context.Context, js jetstream.JetStream, cfg config.NATS) (map[string]bool, error) {
	s, err := js.Stream(ctx, cfg.Stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return map[string]bool{}, nil
	case err != nil:
		return nil, fmt.Errorf("queue: look up stream %s for the retired tenants: %w", cfg.Stream, err)
	}
	return retiredIn(s.CachedInfo().Config), nil
}

// servedOf is what a worker's tenants: leaves once the retired tenants are out, in name order;
// it says once for each tenant it leaves out what to do. A record it cannot read leaves every
// tenant in, as before the record, and says so.
func (c *Consumer) servedOf(ctx context.Context, tenants []string) []string {
	retired, err := readRetired(ctx, c.js, c.cfg)
	if err != nil {
		c.log.WarnContext(ctx, "cannot read which tenants `worker setup` retired; serving every tenant of tenants: as before (grant the worker $JS.API.STREAM.INFO of the job stream)",
			"stream", c.cfg.Stream, "error", err)
		return tenants
	}
	var served []string
	for _, tenant := range tenants {
		if retired[tenant] {
			c.warnRetired(ctx, tenant)
			continue
		}
		served = append(served, tenant)
	}
	return served
}

func (c *Consumer) warnRetired(ctx context.Context, tenant string) {
	c.log.WarnContext(ctx, "`worker setup` retired a tenant this worker's tenants: lists; this worker does not serve it, nor declare its subject or consumer. To serve it again, run `worker setup` with a config that lists it; otherwise remove it from this worker's tenants:",
		"tenant", tenant, "stream", c.cfg.Stream)
}

// isRetired reports whether the worker stopped serving tenant while it ran (retireGone).
func (c *Consumer) isRetired(tenant string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.retired[tenant]
}

// retireGone is redeclareIfGone's for a tenant whose consumer is gone: when the record says
// setup retired the tenant, the worker stops serving it, says so once, and reports true, and
// nothing is declared again.
func (c *Consumer) retireGone(ctx context.Context, tenant string) bool {
	retired, err := readRetired(ctx, c.js, c.cfg)
	if err != nil || !retired[tenant] {
		return false
	}
	c.mu.Lock()
	c.retired[tenant] = true
	c.mu.Unlock()
	c.warnRetired(ctx, tenant)
	return true
}

// A job of a tenant setup retired while the job ran is left to its run, with the tenant's
// consumer (retireUnserved). Should its worker die, the consumer delivers it again once its ack
// wait passed, and no worker of the new config pulls that consumer: a worker ends such a job
// instead. Every sweepEvery it reads the record and, for each retired tenant it does not serve
// whose consumer is left, takes what the consumer delivers now (never a delivery a live
// worker heartbeats) and ends it as dead, reason tenant_retired: the status first, in a
// compare-and-set held to the delivery's attempt (a job that ended meanwhile is acked, or, its
// end one with a dead letter, keeps that letter: EndedLetter), then the dead letter, which the server lets a job have once, and the term. A worker that may
// declare removes the consumer once it holds nothing; else the next `worker setup` does.

// sweepEvery is how often a worker looks for leftovers of retired tenants; sweepLookup bounds
// one look (a worker whose identity may not read the consumer waits that long for nothing).
const (
	sweepEvery  = time.Minute
	sweepLookup = 5 * time.Second
	sweepBatch  = 16
)

// endRetired ends what the consumers of retired tenants deliver again, at most every
// sweepEvery; it is Fetch's, and logs what it could not do.
func (c *Consumer) endRetired(ctx context.Context) {
	c.mu.Lock()
	if time.Since(c.swept) < sweepEvery {
		c.mu.Unlock()
		return
	}
	c.swept = time.Now()
	c.mu.Unlock()
	// Not Fetch's context, which may end (a stop, a short fetch) between a job's dead status
	// and its term: the sweep ends what it began, within its own bound.
	look, cancel := context.WithTimeout(context.WithoutCancel(ctx), sweepLookup)
	defer cancel()
	retired, err := readRetired(look, c.js, c.cfg)
	if err != nil {
		return // servedOf said so at start
	}
	for _, tenant := range slices.Sorted(maps.Keys(retired)) {
		if slices.Contains(c.Tenants(), tenant) || c.sweepRefused(tenant) {
			continue // this worker still runs its jobs (a worker of the old config), or may not
		}
		err := c.endLeftovers(look, tenant)
		if errors.Is(err, ErrRefused) {
			c.refuseSweep(ctx, tenant, err)
			continue
		}
		if err != nil && ctx.Err() == nil {
			c.log.WarnContext(ctx, "cannot end the jobs a retired tenant's consumer delivers again; trying again later (the worker's identity must be allowed to fetch from it)",
				"tenant", tenant, "consumer", consumerName(c.cfg, tenant), "error", err)
		}
	}
}

// endLeftovers ends what tenant's consumers (on its stream and, from before, on the shared one)
// deliver now, and removes each once its stream holds no job of the tenant, when the worker may.
func (c *Consumer) endLeftovers(ctx context.Context, tenant string) error {
	for _, stream := range []string{jobStream(c.cfg, tenant), c.cfg.Stream} {
		if err := c.endLeftoversIn(ctx, stream, tenant); err != nil {
			return err
		}
	}
	return nil
}

// sweepRefused reports whether the server refused this worker tenant's consumer (refuseSweep).
func (c *Consumer) sweepRefused(tenant string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.unswept[tenant]
}

// refuseSweep records that the server refused this worker's login tenant's stream, consumer or
// dead letters (credentials generated without the tenant), and says so once: a refusal is for
// good, and asking again each minute only had the server refuse it again. A worker started with
// credentials that allow it sweeps the tenant.
func (c *Consumer) refuseSweep(ctx context.Context, tenant string, err error) {
	c.mu.Lock()
	c.unswept[tenant] = true
	c.mu.Unlock()
	c.log.WarnContext(ctx, "the NATS server refuses this worker a request it needs to end a retired tenant's jobs (the error names it: the tenant's stream, its consumer, or its jobs' dead letters), so it cannot end the jobs that consumer delivers again; it asks no more. Restart it with credentials generated (`worker nats-config`) while the tenant was listed, or end those jobs with `submit cancel`",
		"tenant", tenant, "consumer", consumerName(c.cfg, tenant), "error", err)
}

// lookConsumer looks up consumer name on stream; ErrRefused at once, with the server's words,
// when the server refuses the look-up, whose refusal shows on the connection alone
// (unlessRefused): waited for, it was the caller's deadline.
func (c *Consumer) lookConsumer(ctx context.Context, stream, name string) (jetstream.Stream, jetstream.Consumer, error) {
	var s jetstream.Stream
	var cons jetstream.Consumer
	refusable := []string{"$JS.API.STREAM.INFO." + stream, "$JS.API.CONSUMER.INFO." + stream + "." + name}
	err := unlessRefused(ctx, c.js.Conn(), refusable, func(ctx context.Context) error {
		var err error
		if s, err = c.js.Stream(ctx, stream); err == nil {
			cons, err = s.Consumer(ctx, name)
		}
		return err
	})
	if errors.Is(err, ErrRefused) {
		return nil, nil, fmt.Errorf("%w: %v", ErrRefused, c.js.Conn().LastError())
	}
	return s, cons, err
}

// endLeftoversIn is endLeftovers' for tenant's consumer on one stream.
func (c *Consumer) endLeftoversIn(ctx context.Context, stream, tenant string) error {
	name := consumerName(c.cfg, tenant)
	s, cons, err := c.lookConsumer(ctx, stream, name)
	switch {
	case errors.Is(err, ErrRefused):
		return fmt.Errorf("queue: look up consumer %s of stream %s: %w (the worker needs $JS.API.STREAM.INFO.%s, and the info and next messages of the consumer)", name, stream, err, stream)
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("queue: look up consumer %s of stream %s: %w", name, stream, err)
	}
	batch, err := cons.FetchNoWait(sweepBatch)
	if err != nil {
		return fmt.Errorf("queue: fetch from consumer %s: %w", name, err)
	}
	for msg := range batch.Messages() {
		d, err := c.delivery(msg)
		if err == nil {
			err = c.endRetiredJob(ctx, d)
		}
		if err != nil {
			return err // the delivery comes again after its ack wait
		}
	}
	if err := batch.Error(); err != nil && !isPullTimeout(err) {
		return fmt.Errorf("queue: fetch from consumer %s: %w", name, err)
	}
	// Removed only once the stream holds no job of the tenant: a job whose term did not reach
	// the server is still there, and only this consumer delivers it again.
	if holds, err := holdsTenant(ctx, s, c.cfg.Subject, tenant); err != nil || holds || c.admin == nil {
		return nil
	}
	if err := s.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("queue: remove consumer %s of retired tenant %s: %w", name, tenant, err)
	}
	c.log.InfoContext(ctx, "removed the consumer of a retired tenant, which holds no job any more", "tenant", tenant, "stream", stream, "consumer", name)
	return nil
}

// endRetiredJob ends one delivery of a retired tenant's job as dead (tenant_retired), unless the
// job ended already: then it terms the message with the end's dead letter (failed, rejected,
// dead: EndedLetter), written unless it is there, or acks it (an end with no letter).
func (c *Consumer) endRetiredJob(ctx context.Context, d *Delivery) error {
	cause := SweptCause(d.Tenant)
	if !job.ValidID(d.JobID) {
		return c.endRetiredNoID(ctx, d, cause)
	}
	now := time.Now().UTC()
	st, err := c.UpdateStatus(ctx, d.Ref(), func(s *job.Status) {
		s.State, s.Error, s.Progress, s.Attempt, s.FinishedAt = job.StateDead, cause.Error(), "", d.Attempt, now
	}, ByAttempt(d.Attempt))
	switch {
	case err == nil:
		_, err = d.Term(ctx, ReasonTenantRetired, cause)
	case errors.Is(err, ErrFinal):
		// Its run, or a sweep that stopped before its term, ended it. An end with a dead letter
		// keeps it: written unless it is there (at most one), then the term; acked, the job had
		// none when its worker stopped between its status and its letter.
		if reason, why, ok := EndedLetter(d.Tenant, st); ok {
			_, err = d.Term(ctx, reason, why)
		} else {
			err = d.Ack(ctx) // the message outlived its worker's ack
		}
	case errors.Is(err, ErrSuperseded):
		return nil // a later delivery holds the job
	}
	if err != nil {
		return err
	}
	c.log.WarnContext(ctx, "ended a job of a retired tenant whose worker stopped before it ended", "tenant", d.Tenant, "job_id", d.JobID,
		"attempt", d.Attempt, "state", string(cmp.Or(st.State, job.StateDead)), "reason", ReasonTenantRetired)
	return nil
}

// SweptCause is the error of the end the sweep gives a job of tenant, retired: its status's,
// and its letter's, whoever writes the letter (EndedLetter knows the end by it).
func SweptCause(tenant string) error {
	return fmt.Errorf("%w %q: `worker setup` retired the tenant while this job ran, and its worker stopped before the job ended; "+
		"run `worker setup` with a config that lists the tenant, and submit the job again", ErrNotServed, tenant)
}

// endRetiredNoID is endRetiredJob's for a message whose subject names no valid job id: its
// status, which its run records under the message's sequence (stream-seq-N, as the runner's
// statusID), says whether the run ended it with a letter (rejected), whose worker stopped
// before the letter: the letter is that end's (EndedLetter), else tenant_retired.
func (c *Consumer) endRetiredNoID(ctx context.Context, d *Delivery, cause error) error {
	reason, why := ReasonTenantRetired, cause
	st, err := c.Status(ctx, Ref{Tenant: d.Tenant, ID: job.SeqID(d.Seq)})
	switch {
	case err == nil:
		if ended, text, ok := EndedLetter(d.Tenant, st); ok {
			reason, why = ended, text
		}
	case !errors.Is(err, ErrUnknownJob):
		return err // the delivery comes again after its ack wait
	}
	_, err = d.Term(ctx, reason, why)
	return err
}

// EndedLetter is the reason and error of the dead letter of tenant's job whose status says it
// ended with one (failed, rejected, dead), as every writer of a letter gives it (the runner, the
// sweep, setup): a dead end's reason is tenant_retired for the sweep's own end (its error is
// SweptCause's), unknown_tenant where setup's prefixes its error, else max_deliveries. ok is
// false for an end with no letter (succeeded, capped, cancelled).
func EndedLetter(tenant string, st job.Status) (reason string, why error, ok bool) {
	switch st.State {
	case job.StateFailed, job.StateRejected:
		return string(st.State), errors.New(st.Error), true
	case job.StateDead:
		if swept := SweptCause(tenant); st.Error == swept.Error() {
			return ReasonTenantRetired, swept, true
		}
		if text, ok := strings.CutPrefix(st.Error, ReasonUnknownTenant+": "); ok {
			return ReasonUnknownTenant, errors.New(text), true
		}
		return reasonMaxDeliveries, errors.New(st.Error), true
	}
	return "", nil, false
}
