package queue

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Before each tenant had a job stream of its own, every tenant's jobs were queued in one
// stream, nats.stream (BOXCAR_JOBS), and its limits were every tenant's together: one
// tenant's queued jobs made every other's submissions fail. The server refuses a stream whose
// subjects overlap another's, so a tenant's stream can be made only once the shared stream
// no longer takes the tenant's subjects. The upgrade drains the shared stream rather than
// moving its jobs, since a job moved while a worker ran it would be delivered again by the
// new stream's consumer and run twice:
//
//   - Declare (`worker setup`, or a worker that may declare) narrows the shared stream to
//     sharedSubject, which no tenant's job is published on, then makes each tenant's stream
//     and consumer. The jobs the shared stream holds stay there, each with its delivery count,
//     and the tenants' consumers on it (an older Boxcar's, same names) are kept.
//   - A worker binds its tenants' consumers on both streams, and asks the one on the shared
//     stream first (drainOld) until the shared stream holds no message of the tenant: it then
//     stops asking it and, when it may declare, removes it. Each job is in one stream, so one
//     consumer delivers it: none is lost and none runs twice. A job submitted again while its
//     first copy is in the shared stream is in both: the worker drops the second copy
//     (dropSecondCopy). Meanwhile the tenant's lag counts its jobs in both (oldLag), and its
//     max_concurrent bounds its jobs in flight on both together (pullDraining).
//   - `worker setup` removes what the workers could not (removeDrained).
//
// The shared stream stays: its metadata records the tenants setup retired (retired.go).

// sharedStreamConfig is the shared stream made new: it takes no job.
func sharedStreamConfig(a *Admin) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        a.cfg.Stream,
		Description: "Boxcar: the tenants `worker setup` retired (metadata); jobs are in each tenant's stream, " + a.cfg.Stream + "_<tenant>",
		Subjects:    []string{sharedSubject(a.cfg)},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    a.cfg.Replicas,
		MaxMsgs:     -1,
		MaxBytes:    -1,
		Discard:     jetstream.DiscardNew,
		// A submitter finds its tenant's jobs here by a direct get of the job's subject
		// (Client.inShared): the stream's info, which it is not granted, lists every tenant's.
		AllowDirect: true,
	}
}

// sharedStream returns the shared stream, made when missing.
func (a *Admin) sharedStream(ctx context.Context) (jetstream.Stream, error) {
	s, err := a.js.Stream(ctx, a.cfg.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = a.js.CreateStream(ctx, sharedStreamConfig(a))
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			s, err = a.js.Stream(ctx, a.cfg.Stream) // another worker made it first
		}
	}
	if err != nil {
		return nil, fmt.Errorf("queue: set up stream %s: %w", a.cfg.Stream, err)
	}
	return s, nil
}

// narrowShared makes the shared stream take no job (sharedSubject alone), keeping what it
// holds and its tenants' consumers, and removes those whose tenant's jobs it holds no more.
func (a *Admin) narrowShared(ctx context.Context) error {
	s, err := a.sharedStream(ctx)
	if err != nil {
		return err
	}
	if err := a.removeShared(ctx, s); err != nil {
		return err
	}
	cur := s.CachedInfo().Config
	next := cur
	next.Subjects, next.RePublish, next.Replicas, next.AllowRollup = []string{sharedSubject(a.cfg)}, nil, a.cfg.Replicas, allowRollups
	next.AllowDirect = true
	if !reflect.DeepEqual(next, cur) {
		if s, err = a.js.UpdateStream(ctx, next); err != nil {
			return fmt.Errorf("queue: stop the shared stream %s taking jobs, so that each tenant's stream can: %w", a.cfg.Stream, err)
		}
	}
	if took := subjectTenants(a.cfg, cur.Subjects); len(took) > 0 {
		a.log.WarnContext(ctx, "the shared job stream takes no job any more: each tenant has a stream of its own. The jobs queued in it stay, and the tenants' consumers on it deliver them until it holds none",
			"stream", a.cfg.Stream, "tenants", took, "queued", s.CachedInfo().State.Msgs)
	}
	return a.removeDrained(ctx, s)
}

// removeDrained removes the tenants' consumers on the shared stream whose tenant's jobs it
// holds no more: nothing is left for them to deliver.
func (a *Admin) removeDrained(ctx context.Context, s jetstream.Stream) error {
	for info := range s.ListConsumers(ctx).Info() {
		tenant, ok := strings.CutPrefix(info.Name, a.cfg.Consumer+"-")
		if !ok {
			continue
		}
		holds, err := holdsTenant(ctx, s, a.cfg.Subject, tenant)
		if err != nil || holds {
			continue // asked again at the next setup
		}
		if err := s.DeleteConsumer(ctx, info.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("queue: remove consumer %s of the shared stream %s, which holds no job of tenant %s: %w", info.Name, a.cfg.Stream, tenant, err)
		}
		a.log.InfoContext(ctx, "removed a tenant's consumer on the shared job stream, which holds no job of the tenant any more", "stream", a.cfg.Stream, "consumer", info.Name, "tenant", tenant)
	}
	return nil
}

// holdsTenant reports whether the stream holds a message on one of tenant's job subjects.
func holdsTenant(ctx context.Context, s jetstream.Stream, subject, tenant string) (bool, error) {
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject+"."+tenant+".*"))
	if err != nil {
		return false, err
	}
	return len(info.State.Subjects) > 0, nil
}

// oldConsumer is a tenant's consumer on the shared stream while the worker drains it.
type oldConsumer struct {
	cons jetstream.Consumer
	// quietUntil is when the worker asks it again after a pull that found nothing while the
	// shared stream still held a job of the tenant (see drainLook).
	quietUntil time.Time
}

// drainLook is how long a worker leaves a tenant's consumer on the shared stream unasked once a
// pull found nothing there while the stream still held a job of the tenant: one another worker
// runs, delivered again only when that worker hands it back or dies. Asked at every pull
// instead, it cost a pull's wait and a look at the stream before each pull of the tenant's own
// stream, in every round of a worker of several tenants, for as long as that job ran. Such a
// job, handed back, waits at most this much longer: what an idle worker of one tenant waits
// between its pulls anyway.
const drainLook = pullWait

// drainPace is how often a worker of one tenant, while it drains the tenant's consumer on the
// shared stream, looks at the tenant's jobs in flight and pulls (pullDraining): a new job of the
// tenant waits up to this much longer than one pull's wait while the upgrade drains.
const drainPace = time.Second

// pullDraining is pullOne of a tenant whose consumer on the shared stream the worker drains: the
// tenant's max_concurrent bounds its jobs in flight on its two consumers together, not on each
// (roomAcross), and while they hold that many the worker takes none. Each consumer's
// max_ack_pending bounds only its own stream's, so asked alone the tenant ran up to twice its
// bound. The pulls are short (lookPull), each after a look at that count, so that a job another
// worker takes in between is seen before the next: a pull waiting on the server while the
// tenant filled its bound would still deliver. It then waits out the rest of wait, as a pull
// that found nothing does.
func (c *Consumer) pullDraining(ctx context.Context, tenant string, wait time.Duration) (jetstream.Msg, error) {
	until := time.Now().Add(wait)
	room, err := c.roomAcross(ctx, tenant)
	if err != nil {
		return nil, err
	}
	if room {
		if msg, ok := c.drainOld(ctx, tenant); ok {
			return msg, nil
		}
		msg, err := pullFrom(ctx, c.cons[tenant], min(wait, lookPull))
		if !isPullTimeout(err) {
			return msg, err
		}
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(time.Until(until)):
		return nil, nats.ErrTimeout
	}
}

// roomAcross reports whether tenant's jobs in flight on its consumer on its own stream and on
// its consumer on the shared stream (those an old worker runs too) are fewer than its
// max_concurrent, its own stream's consumer's max_ack_pending as the server holds it.
func (c *Consumer) roomAcross(ctx context.Context, tenant string) (bool, error) {
	info, err := c.cons[tenant].Info(ctx)
	if err != nil {
		return false, fmt.Errorf("queue: look up consumer %s: %w", consumerName(c.cfg, tenant), err)
	}
	c.noteAckWait(info)
	_, inFlight, err := c.oldLag(ctx, tenant)
	if err != nil {
		return false, err
	}
	most := info.Config.MaxAckPending
	return most <= 0 || uint64(max(info.NumAckPending, 0))+inFlight < uint64(most), nil
}

// drainOld is the delivery of tenant's consumer on the shared stream, asked before the
// tenant's own stream while the shared stream holds jobs of the tenant (see above), and not
// again for drainLook once it found nothing to pull. Once the stream holds no job of the
// tenant, the worker stops asking it and, when it may declare, removes the consumer.
func (c *Consumer) drainOld(ctx context.Context, tenant string) (jetstream.Msg, bool) {
	old := c.askOld(tenant)
	if old == nil {
		return nil, false
	}
	msg, err := pullFrom(ctx, old.cons, lookPull)
	if err == nil {
		return msg, true
	}
	if ctx.Err() != nil {
		return nil, false
	}
	// Nothing to pull, or the pull failed: a job another worker runs, or none left.
	if holds, err := holdsTenant(ctx, c.shared, c.cfg.Subject, tenant); err != nil || holds {
		c.mu.Lock()
		old.quietUntil = time.Now().Add(drainLook)
		c.mu.Unlock()
		return nil, false
	}
	c.endDrain(ctx, tenant)
	return nil, false
}

// askOld is tenant's consumer on the shared stream when the worker is to ask it now: nil once
// it drained it, and while it is quiet.
func (c *Consumer) askOld(tenant string) *oldConsumer {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.old[tenant]
	if old == nil || time.Now().Before(old.quietUntil) {
		return nil
	}
	return old
}

// endDrain stops asking tenant's consumer on the shared stream, which holds no job of the
// tenant any more, and removes it when the worker may declare.
func (c *Consumer) endDrain(ctx context.Context, tenant string) {
	c.mu.Lock()
	delete(c.old, tenant)
	c.mu.Unlock()
	name := consumerName(c.cfg, tenant)
	if c.admin != nil {
		if err := c.shared.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			c.log.WarnContext(ctx, "cannot remove a tenant's consumer on the shared job stream; the next `worker setup` does", "tenant", tenant, "consumer", name, "error", err)
			return
		}
	}
	c.log.InfoContext(ctx, "the shared job stream holds no job of the tenant any more; fetching from the tenant's own stream only", "tenant", tenant,
		"stream", c.cfg.Stream, "consumer", name, "removed", c.admin != nil)
}

// draining reports whether the worker still drains a consumer of the shared stream of one of
// the tenants.
func (c *Consumer) draining(tenants ...string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.ContainsFunc(tenants, func(t string) bool { return c.old[t] != nil })
}

// oldLag is what tenant's consumer on the shared stream holds while the worker drains it: jobs
// not delivered yet and jobs in flight, which the tenant's lag counts with its own stream's
// (ConsumerLag), so that the pool warms sandboxes and the metrics show demand for them too.
func (c *Consumer) oldLag(ctx context.Context, tenant string) (pending, inFlight uint64, err error) {
	c.mu.Lock()
	old := c.old[tenant]
	c.mu.Unlock()
	if old == nil {
		return 0, 0, nil
	}
	info, err := old.cons.Info(ctx)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		return 0, 0, nil // removed once drained, by another worker or `worker setup`
	case err != nil:
		return 0, 0, fmt.Errorf("queue: look up consumer %s of the shared stream %s: %w", consumerName(c.cfg, tenant), c.cfg.Stream, err)
	}
	c.noteAckWait(info)
	return info.NumPending, uint64(max(info.NumAckPending, 0)), nil
}

// dropSecondCopy acknowledges, and so drops, a job the tenant's stream delivered while the
// shared stream holds it too, and reports whether it did. Such a job was submitted again while
// its copy from before the upgrade waited there: neither stream knows the other's jobs, so
// each took its copy. The shared stream takes no job any more, so its copy is the first, and
// runs from there (or runs already on another worker); this one would run beside it. A copy the
// shared stream no longer holds was settled: the job's committed run or final status ends this
// delivery with nothing run, as for any job submitted again after its end. While the worker
// cannot tell, it holds the message (in progress) and asks again every second.
func (c *Consumer) dropSecondCopy(ctx context.Context, msg jetstream.Msg) bool {
	meta, err := msg.Metadata()
	r := c.subjectRef(msg)
	if err != nil || meta.Stream == c.cfg.Stream || !c.draining(r.Tenant) {
		return false
	}
	log := c.log.With("job_id", r.ID, "tenant", r.Tenant, "stream", c.cfg.Stream)
	for said := false; ; said = true {
		held, err := inStream(ctx, c.shared, c.cfg, r)
		switch {
		case err == nil && !held:
			return false
		case err == nil:
			if err := msg.DoubleAck(ctx); err != nil {
				log.WarnContext(ctx, "cannot drop a job submitted again while its first copy is in the shared job stream; it is delivered again and dropped then", "error", err)
			} else {
				log.InfoContext(ctx, "dropped a job submitted again while its first copy is in the shared job stream, which runs it")
			}
			return true
		case ctx.Err() != nil:
			_ = msg.Nak() // the worker stops: another takes it
			return true
		case !said:
			log.WarnContext(ctx, "cannot tell whether the shared job stream holds the first copy of a job; holding it and asking again every second", "error", err)
		}
		_ = msg.InProgress()
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// bindOld binds tenant's consumer on the shared stream, if the shared stream holds one.
func (c *Consumer) bindOld(ctx context.Context, tenant string) error {
	if c.shared == nil {
		return nil
	}
	cons, err := c.shared.Consumer(ctx, consumerName(c.cfg, tenant))
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("queue: look up consumer %s of the shared stream %s: %w", consumerName(c.cfg, tenant), c.cfg.Stream, err)
	}
	c.old[tenant] = &oldConsumer{cons: cons}
	c.noteAckWait(cons.CachedInfo())
	return nil
}

// moveStranded moves the jobs the shared stream holds of a kept tenant that has no consumer on
// it to the tenant's own stream: an older Boxcar's from before tenants, whose one consumer
// removeShared removed, or a consumer an operator removed. No consumer delivered them since,
// so none runs on a worker, and none would deliver them where they are. A job whose subject
// the tenant's stream holds already is queued there: it is only removed here.
func (a *Admin) moveStranded(ctx context.Context, streams map[string]jetstream.Stream) error {
	s, err := a.js.Stream(ctx, a.cfg.Stream)
	if err != nil {
		return fmt.Errorf("queue: look up stream %s: %w", a.cfg.Stream, err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(a.cfg.Subject+".>"))
	if err != nil {
		return fmt.Errorf("queue: list the subjects of stream %s: %w", a.cfg.Stream, err)
	}
	moved, consumed := map[string]int{}, map[string]bool{}
	for subject := range info.State.Subjects {
		r := refOf(strings.TrimPrefix(subject, a.cfg.Subject+"."))
		if streams[r.Tenant] == nil {
			continue
		}
		has, asked := consumed[r.Tenant]
		if !asked {
			_, err := s.Consumer(ctx, consumerName(a.cfg, r.Tenant))
			has = !errors.Is(err, jetstream.ErrConsumerNotFound) // or asked again at the next setup
			consumed[r.Tenant] = has
		}
		if has {
			continue // drained by it
		}
		m, err := s.GetLastMsgForSubject(ctx, subject)
		if err != nil {
			return fmt.Errorf("queue: read job %s in the shared stream %s: %w", subject, a.cfg.Stream, err)
		}
		_, err = a.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: m.Header, Data: m.Data}, jetstream.WithExpectStream(jobStream(a.cfg, r.Tenant)))
		if err != nil && !subjectFull(err) {
			return fmt.Errorf("queue: move job %s from the shared stream %s to %s: %w", subject, a.cfg.Stream, jobStream(a.cfg, r.Tenant), err)
		}
		if err := s.DeleteMsg(ctx, m.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("queue: remove job %s from the shared stream once moved: %w", subject, err)
		}
		moved[r.Tenant]++
	}
	if len(moved) > 0 {
		a.log.WarnContext(ctx, "moved the jobs the shared job stream held of tenants with no consumer on it to their tenants' streams", "stream", a.cfg.Stream, "jobs", moved)
	}
	return nil
}
