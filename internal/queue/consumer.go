package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
)

// Consumer is a worker's handle: it fetches and settles jobs, writes their statuses, asks for
// approvals and advertises the worker's profiles. It binds to what an Admin declared.
type Consumer struct {
	js      jetstream.JetStream
	cfg     config.NATS
	log     *slog.Logger
	tenants []string                      // sorted: the order fetches go round
	cons    map[string]jetstream.Consumer // by tenant
	streams map[string]jetstream.Stream   // each tenant's job stream, by tenant
	// shared is the shared stream (drain.go), nil when there is none; old, by tenant, the
	// consumers on it the worker still asks (under mu).
	shared   jetstream.Stream
	old      map[string]*oldConsumer
	statuses *tenantBuckets // each tenant's (statusbuckets.go)
	cancels  *tenantBuckets // each tenant's (cancel.go)
	// sharedCancels is the cancel bucket older submitters and workers use during an upgrade,
	// nil when there is none (cancel.go).
	sharedCancels jetstream.KeyValue
	approvals     *tenantBuckets // each tenant's (approvals.go)
	written       statusCache    // the statuses this handle wrote last (status.go)
	ear           *waker         // new jobs' notifications, for a worker of several tenants (wake.go)
	// admin, when the worker has the operator's rights, declares the streams again when NATS
	// lost them; nil for a worker that only binds.
	admin *Admin

	concurrency *tenantConcurrency // this worker's tenants: against their consumers on the server

	waitsMu  sync.Mutex
	ackWaits map[string]time.Duration // waitKey → the consumer's ack deadline as the server has it

	mu      sync.Mutex
	next    int             // the tenant whose consumer the next fetch asks first
	checked time.Time       // when redeclareIfGone last looked
	retired map[string]bool // tenants setup retired while the worker ran (retireGone)
	swept   time.Time       // when endRetired last looked
	unswept map[string]bool // retired tenants whose consumer the server refuses this worker (refuseSweep)

	health fetchHealth // for FetchErr (fetchhealth.go)
}

// NewConsumer binds to each tenant's job stream, the consumer of each tenant the worker serves (nil: the
// one tenant default) and the buckets. It creates nothing: a missing one is ErrNotReady,
// naming `worker setup`. A tenant `worker setup` retired is left out (retired.go); every one
// retired is ErrNotReady too. admin, when not nil, sets them up again should NATS lose them
// while the worker runs.
func NewConsumer(ctx context.Context, nc *nats.Conn, cfg config.NATS, tenants map[string]config.Tenant, log *slog.Logger, admin *Admin) (*Consumer, error) {
	js, err := newJetStream(nc)
	if err != nil {
		return nil, err
	}
	want := tenantsOrDefault(cfg, tenants)
	c := &Consumer{js: js, cfg: cfg, log: log, admin: admin, cons: map[string]jetstream.Consumer{}, streams: map[string]jetstream.Stream{},
		old: map[string]*oldConsumer{}, concurrency: newTenantConcurrency(cfg, want, log), ackWaits: map[string]time.Duration{}, retired: map[string]bool{}, unswept: map[string]bool{}}
	names := c.servedOf(ctx, slices.Sorted(maps.Keys(want)))
	if len(names) == 0 {
		return nil, fmt.Errorf("%w: `worker setup` retired every tenant of this worker's tenants: (%s); run it with a config that lists them to serve them again",
			ErrNotReady, strings.Join(slices.Sorted(maps.Keys(want)), ", "))
	}
	c.tenants = names
	if c.shared, err = js.Stream(ctx, cfg.Stream); errors.Is(err, jetstream.ErrStreamNotFound) {
		c.shared = nil
	} else if err != nil {
		return nil, fmt.Errorf("queue: look up stream %s: %w", cfg.Stream, err)
	}
	for _, tenant := range names {
		if err := c.bind(ctx, tenant); err != nil {
			return nil, err
		}
		cons, name := c.cons[tenant], consumerName(cfg, tenant)
		c.concurrency.check(ctx, tenant, cons.CachedInfo().Config.MaxAckPending)
		if server := cons.CachedInfo().Config.AckWait; server != time.Duration(cfg.AckWait) {
			log.WarnContext(ctx, "a tenant's ack_wait differs between this worker's config and its consumer on the NATS server; "+
				"the server's applies, and this worker's heartbeats follow it. Give every worker the same config, then run `worker setup` with it to set the server's",
				"tenant", tenant, "consumer", name, "server_ack_wait", server.String(), "config_ack_wait", time.Duration(cfg.AckWait).String())
		}
		c.noteAckWait(cons.CachedInfo())
	}
	if len(names) > 1 {
		if c.ear, err = listen(nc, cfg.Subject, names); err != nil {
			return nil, fmt.Errorf("queue: listen for new jobs: %w", err)
		}
	}
	if err := c.bindBuckets(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// bindBuckets binds the worker's tenants' status, approvals and cancel buckets, and the shared
// cancel bucket where an older Boxcar made it.
func (c *Consumer) bindBuckets(ctx context.Context) error {
	var err error
	if c.statuses, err = newStatusBuckets(ctx, c.js, c.cfg); err != nil {
		return err
	}
	c.approvals = newTenantBuckets(c.js, c.cfg.ApprovalsBucket, "approvals")
	c.cancels = newTenantBuckets(c.js, CancelBucket, "cancel")
	for _, b := range []*tenantBuckets{c.approvals, c.cancels} {
		if err := b.learnShared(ctx); err != nil {
			return err
		}
	}
	if !c.cancels.shared.stream.absent() {
		if c.sharedCancels, err = bucket(ctx, c.js, CancelBucket, "cancel"); err != nil {
			return err
		}
	}
	for _, tenant := range c.tenants {
		for _, b := range []*tenantBuckets{c.statuses, c.approvals, c.cancels} {
			if _, err := b.of(ctx, tenant); err != nil {
				return err
			}
		}
	}
	return nil
}

// bind binds tenant's job stream and its consumer there, and its consumer on the shared stream
// while there is one (drain.go). A refusal of the look-up fails at once (lookConsumer).
func (c *Consumer) bind(ctx context.Context, tenant string) error {
	name, stream := consumerName(c.cfg, tenant), jobStream(c.cfg, tenant)
	s, cons, err := c.lookConsumer(ctx, stream, name)
	switch {
	case errors.Is(err, ErrRefused):
		return fmt.Errorf("queue: bind tenant %s's job stream %s: %w; the worker's NATS credentials were generated without the tenant: generate them again (`worker nats-config`) from a config that lists it",
			tenant, stream, err)
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrConsumerNotFound):
		return fmt.Errorf("%w: consumer %s of stream %s (tenant %s) does not exist on %s; %s", ErrNotReady, name, stream, tenant, c.js.Conn().ConnectedUrlRedacted(), setupHint)
	case err != nil:
		return fmt.Errorf("queue: look up consumer %s of stream %s: %w", name, stream, err)
	}
	c.streams[tenant], c.cons[tenant] = s, cons
	return c.bindOld(ctx, tenant)
}

// Open declares everything and binds a Consumer to it: what a worker does at start. A worker
// whose identity may not declare (the server refused a $JS.API request to create or update)
// binds to what `worker setup` declared, and fails with ErrNotReady, naming `worker setup`,
// when something is missing.
func Open(ctx context.Context, nc *nats.Conn, cfg config.NATS, tenants map[string]config.Tenant, log *slog.Logger) (*Consumer, error) {
	admin, err := NewAdmin(nc, cfg, tenants, log)
	if err != nil {
		return nil, err
	}
	admin.worker = true
	if err := declareUnlessRefused(ctx, nc, admin); err != nil {
		if !refused(nc) {
			return nil, err
		}
		log.InfoContext(ctx, "this identity may not declare the job stream, consumers and buckets; binding to the ones `worker setup` declared", "refused", nc.LastError().Error())
		return NewConsumer(ctx, nc, cfg, tenants, log, nil)
	}
	return NewConsumer(ctx, nc, cfg, tenants, log, admin)
}

// declareUnlessRefused runs Declare, and ends it as soon as the server refuses one of its
// requests: the refusal comes on the connection while the request waits for a reply that
// never comes.
func declareUnlessRefused(ctx context.Context, nc *nats.Conn, admin *Admin) error {
	before := nc.LastError()
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- admin.Declare(dctx) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			// The same error value is the refusal seen before Declare began, not a new one.
			if err := nc.LastError(); err != before && refused(nc) { //nolint:errorlint // identity, not kind
				cancel()
				<-done
				return err
			}
		}
	}
}

// refused reports whether the server refused the connection a JetStream API request: its
// permissions do not allow the subject. The server says so on the connection, not in a reply,
// so the request itself only times out.
// Refused says whether NATS refused this connection a JetStream API request: such a refusal
// shows on the connection, and the request itself only times out.
func Refused(nc *nats.Conn) bool { return refused(nc) }

func refused(nc *nats.Conn) bool {
	err := nc.LastError()
	return errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), "$JS.API.")
}

// Fetch waits for the next job and returns its delivery. It returns only when a message
// arrives or ctx ends, so callers fetch only when they have a free slot.
//
// With more than one tenant, each fetch asks the tenants' consumers in turn, starting after
// the tenant it got the last job from: a worker with a free slot takes the next tenant's job
// before a second one of a tenant with a burst, and each tenant's max_concurrent bounds what
// its burst holds across the fleet.
func (c *Consumer) Fetch(ctx context.Context) (*Delivery, error) {
	failing := false // a failure was logged: say once when fetching works again
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		c.endRetired(ctx)
		msg, err := c.pull(ctx)
		if failing && (err == nil || isPullTimeout(err)) {
			failing = false
			c.log.InfoContext(ctx, "fetching jobs again")
		}
		switch {
		case err == nil:
			c.health.fetched()
			if c.dropSecondCopy(ctx, msg) {
				continue
			}
			return c.delivery(msg)
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case isPullTimeout(err):
			c.health.fetched()
			c.redeclareIfGone(ctx)
			continue
		default:
			c.health.failed(err)
			c.redeclareIfGone(ctx)
			// Once per outage, not once a second: the connection's own log says more.
			if !failing {
				failing = true
				c.log.WarnContext(ctx, "fetch failed; retrying every second", "error", err)
			} else {
				c.log.DebugContext(ctx, "fetch failed again", "error", err)
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Second):
			}
		}
	}
}

// pullWait is how long one pull waits for a job on the server: short pulls keep the request
// alive across server restarts and leader changes. idlePull is the wait on each tenant's
// consumer in turn while none has a job: a new job of any tenant waits at most that long
// times the number of other tenants. lookPull is the first round's: not a no-wait pull, which
// the server holds for a second on a consumer at its max_ack_pending (a tenant using its whole
// share), so every other tenant's next job would wait that second.
const (
	pullWait = 10 * time.Second
	idlePull = 250 * time.Millisecond
	lookPull = 20 * time.Millisecond
)

// pull returns the next message of the tenants' consumers. One tenant waits as the worker
// always did, pullWait on its consumer. Several: a round that waits lookPull on each in turn;
// while all are empty and no job waits, the worker waits for the job stream's notification of
// a new job (await). A worker the notifications do not reach asks each tenant idlePull in
// turn instead, as before they existed.
func (c *Consumer) pull(ctx context.Context) (jetstream.Msg, error) {
	if len(c.tenants) == 1 {
		pullCtx, cancel := context.WithTimeout(ctx, pullWait)
		defer cancel()
		if c.isRetired(c.tenants[0]) {
			<-pullCtx.Done() // nothing to serve: wait as a pull that finds nothing does
			return nil, pullCtx.Err()
		}
		if c.draining(c.tenants[0]) {
			return c.pullDraining(ctx, c.tenants[0], drainPace)
		}
		return c.cons[c.tenants[0]].Next(jetstream.FetchContext(pullCtx))
	}
	if c.ear == nil {
		return c.round(ctx, lookPull, idlePull)
	}
	ear, polling := c.ear.ear()
	if polling {
		return c.round(ctx, lookPull, idlePull)
	}
	msg, err := c.round(ctx, lookPull)
	switch {
	case !isPullTimeout(err):
		return msg, err
	case c.held(ctx, c.tenants...):
		return c.round(ctx, idlePull)
	}
	return c.await(ctx, ear)
}

// await waits, with no job to take, for the notification of a new one (ear: taken before the
// round that found none, so one sent during it is not missed), then asks its tenant alone;
// another worker may have taken it, and the wait goes on. After idleCheck without one it asks
// every tenant; a job found then was announced to no one here (wake.go).
func (c *Consumer) await(ctx context.Context, ear <-chan struct{}) (jetstream.Msg, error) {
	for {
		tenant, woken, err := c.ear.idle(ctx, ear)
		if err != nil {
			return nil, err
		}
		if !woken {
			msg, err := c.round(ctx, lookPull)
			if err == nil && c.ear.unheard() {
				c.log.WarnContext(ctx, "a job waited with no notification of it; asking each tenant's consumer in turn while idle (grant the worker subscribe on the subject, and run `worker setup` so the job stream sends them)",
					"subject", queuedSubject(c.cfg.Subject)+".<tenant>.*")
			}
			return msg, err
		}
		ear, _ = c.ear.ear()
		msg, err := c.pullOne(ctx, tenant, lookPull)
		switch {
		case err == nil:
			c.mu.Lock()
			c.next = (slices.Index(c.tenants, tenant) + 1) % len(c.tenants)
			c.mu.Unlock()
			return msg, nil
		case !isPullTimeout(err):
			return nil, err
		case c.held(ctx, tenant):
			return c.round(ctx, idlePull)
		}
	}
}

// held reports whether jobs of the tenants wait that a pull found none of (or their consumers
// could not be read): a tenant at its max_concurrent, whose next job comes free when one of its
// jobs ends on any worker, which sends no notification. The worker then asks each tenant in
// turn.
func (c *Consumer) held(ctx context.Context, tenants ...string) bool {
	if c.draining(tenants...) {
		return true // the shared stream sends no notification
	}
	for _, tenant := range tenants {
		if c.isRetired(tenant) {
			continue
		}
		info, err := c.cons[tenant].Info(ctx)
		if err != nil || info.NumPending > 0 {
			return true
		}
		c.noteAckWait(info)
	}
	return false
}

// round asks the tenants' consumers in turn, starting after the tenant the last job came
// from, once for each wait, and returns the first message.
func (c *Consumer) round(ctx context.Context, waits ...time.Duration) (jetstream.Msg, error) {
	c.mu.Lock()
	first := c.next
	c.mu.Unlock()
	var lastErr error
	for _, wait := range waits {
		for k := range c.tenants {
			i := (first + k) % len(c.tenants)
			msg, err := c.pullOne(ctx, c.tenants[i], wait)
			if err == nil {
				c.mu.Lock()
				c.next = (i + 1) % len(c.tenants)
				c.mu.Unlock()
				return msg, nil
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if !isPullTimeout(err) {
				lastErr = err
			}
		}
	}
	if lastErr != nil {
		return nil, lastErr
	}
	return nil, nats.ErrTimeout
}

// pullOne asks one tenant's consumer for one message, waiting up to wait, and returns at once
// when ctx ends, so that a worker's stop does not wait out the pull; the pull's inbox goes
// with it, and the server sends it nothing more.
func (c *Consumer) pullOne(ctx context.Context, tenant string, wait time.Duration) (jetstream.Msg, error) {
	if c.isRetired(tenant) {
		return nil, nats.ErrTimeout
	}
	if c.draining(tenant) {
		return c.pullDraining(ctx, tenant, wait)
	}
	return pullFrom(ctx, c.cons[tenant], wait)
}

// pullFrom asks one consumer for one message, as pullOne says.
func pullFrom(ctx context.Context, cons jetstream.Consumer, wait time.Duration) (jetstream.Msg, error) {
	listen, cancel := context.WithTimeout(ctx, wait+pullListen)
	defer cancel()
	pullCtx := expiry{Context: listen, at: time.Now().Add(min(wait*10/9, wait+time.Second))}
	msg, err := cons.Next(jetstream.FetchContext(pullCtx))
	if errors.Is(err, jetstream.ErrInvalidOption) && !time.Now().Before(pullCtx.at) {
		// The machine stalled past the pull's expiry before it was sent: nothing was asked.
		return nil, nats.ErrTimeout
	}
	return msg, err
}

// pullListen is how much longer than its wait a pull listens for the server's answer, as
// FetchMaxWait's pulls do: the answer to a pull sent late on a loaded machine still arrives.
const pullListen = time.Second

// expiry is a pull's context for FetchContext, which takes the server's expiry from the
// context's deadline (the time left less a tenth of it, at most a second) and stops listening
// when the context ends. A deadline alone would leave a 20 ms pull 2 ms for the answer, and a
// job the server sends past that would not be received and wait out its ack wait (one attempt
// spent); on a loaded machine (a load of 11 on 2 cores) a pull stalled 22 ms before it was
// sent. So the deadline it reports (at) gives the server the pull's wait, and the context it
// wraps ends pullListen later, or with the caller's.
type expiry struct {
	context.Context
	at time.Time
}

// Deadline is what FetchContext reads to set the server's expiry: with its margin off, the
// pull's wait.
func (e expiry) Deadline() (time.Time, bool) { return e.at, true }

// redeclareIfGone sets the streams, consumer and buckets up again when the job stream or its
// consumer is gone: NATS came back without its data (a server whose storage was lost, or an
// operator who removed them). The handles this queue holds go on working on the new ones, as
// they are found by name. A worker without the operator's rights says what to run instead.
func (c *Consumer) redeclareIfGone(ctx context.Context) {
	// An idle worker of several tenants ends a pull every idlePull per tenant: look once per
	// pullWait, as one tenant's worker does.
	c.mu.Lock()
	if time.Since(c.checked) < pullWait {
		c.mu.Unlock()
		return
	}
	c.checked = time.Now()
	c.mu.Unlock()
	var (
		err    error
		tenant string
	)
	for _, tenant = range c.tenants {
		if c.isRetired(tenant) {
			continue
		}
		var cons jetstream.Consumer
		cons, err = c.js.Consumer(ctx, jobStream(c.cfg, tenant), consumerName(c.cfg, tenant))
		if errors.Is(err, jetstream.ErrConsumerNotFound) && c.retireGone(ctx, tenant) {
			err = nil
			continue
		}
		if err != nil {
			break
		}
		c.noteAckWait(cons.CachedInfo())
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		if err == nil {
			c.health.setGone("")
		}
		return
	}
	if c.admin == nil {
		c.health.setGone(c.goneWhat(tenant, err))
		c.log.ErrorContext(ctx, "a tenant's job stream or its consumer is gone from NATS; run `worker setup` with an operator identity", "stream", jobStream(c.cfg, tenant), "error", err)
		return
	}
	c.log.WarnContext(ctx, "a tenant's job stream or its consumer is gone from NATS; setting them up again", "stream", jobStream(c.cfg, tenant), "error", err)
	if err := c.admin.Declare(ctx); err != nil {
		c.health.setGone(c.goneWhat(tenant, err))
		c.log.ErrorContext(ctx, "set up the job stream again failed; trying at the next fetch", "error", err)
		return
	}
	c.health.setGone("")
	c.log.InfoContext(ctx, "job stream and consumer set up again")
}

// isPullTimeout reports a pull that ended with nothing to deliver, which is no failure.
func isPullTimeout(err error) bool {
	return errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoHeartbeat)
}

func (c *Consumer) delivery(msg jetstream.Msg) (*Delivery, error) {
	meta, err := msg.Metadata()
	if err != nil {
		return nil, fmt.Errorf("queue: message metadata: %w", err)
	}
	ref := c.subjectRef(msg)
	return &Delivery{
		msg:       msg,
		c:         c,
		Tenant:    ref.Tenant,
		JobID:     ref.ID,
		Data:      msg.Data(),
		Attempt:   int(meta.NumDelivered),
		Published: meta.Timestamp,
		Seq:       meta.Sequence.Stream,
		consumer:  waitKey(meta.Stream, meta.Consumer),
	}, nil
}

// subjectRef is the job a message names by its subject, boxcar.jobs.T.J, which the server let
// only tenant T's submitters publish on: never by its payload, nor by a header (a
// Nats-Msg-Id is whatever the publisher set). A subject of another shape names no job (an
// empty id, which the runner rejects).
func (c *Consumer) subjectRef(msg jetstream.Msg) Ref {
	rest, ok := strings.CutPrefix(msg.Subject(), c.cfg.Subject+".")
	r := refOf(rest)
	if !ok || !job.ValidTenant(r.Tenant) {
		return Ref{Tenant: job.DefaultTenant}
	}
	return r
}

// noteAckWait keeps a consumer's ack deadline as the server last told it: `worker setup` may
// change it while the worker runs, and each delivery's heartbeats follow its consumer's.
func (c *Consumer) noteAckWait(info *jetstream.ConsumerInfo) {
	c.waitsMu.Lock()
	defer c.waitsMu.Unlock()
	c.ackWaits[waitKey(info.Stream, info.Name)] = info.Config.AckWait
}

// waitKey names a consumer among the worker's by its stream too: a tenant's consumer on the
// shared stream, while the worker drains it (drain.go), has the name of its consumer on the
// tenant's stream, and may have another ack wait (an older Boxcar's, or one an operator set),
// which the heartbeats of a job it delivered must follow, not the new one's.
func waitKey(stream, consumer string) string { return stream + " " + consumer }

// ackWaitOf is the ack deadline of the consumer that delivered a message: the shortest known
// for one the worker did not bind to, which cannot deliver to it.
func (c *Consumer) ackWaitOf(consumer string) time.Duration {
	c.waitsMu.Lock()
	defer c.waitsMu.Unlock()
	if d, ok := c.ackWaits[consumer]; ok {
		return d
	}
	return slices.Min(slices.Collect(maps.Values(c.ackWaits)))
}

// Lag is one tenant's jobs as its consumer holds them (with, while the worker drains it, its
// consumer on the shared stream: drain.go): not delivered yet (Pending) and delivered but not
// yet acknowledged (AckPending).
type Lag struct {
	Tenant              string
	Pending, AckPending uint64
	// MaxAckPending is the tenant's max_concurrent as its consumer holds it (0 or less: none).
	MaxAckPending int
	// ConfigMismatch is true while MaxAckPending differs from this worker's tenants:.
	ConfigMismatch bool
}

// Startable is how many of the pending jobs could be delivered now: no more than the tenant's
// max_concurrent leaves room for across the fleet. A warm pool is sized by it, so that it warms
// no sandbox for a job that must wait for another of its tenant's to end.
func (l Lag) Startable() uint64 {
	if l.MaxAckPending <= 0 {
		return l.Pending
	}
	return min(l.Pending, uint64(max(l.MaxAckPending-int(l.AckPending), 0)))
}

// ConsumerLag reports, from the server's view of each tenant's durable consumer, how many jobs
// wait to be delivered and how many are in flight, by tenant in name order; while the worker
// drains the tenant's consumer on the shared stream (drain.go), its jobs there too. The numbers
// are cluster-wide: every worker sees the same.
func (c *Consumer) ConsumerLag(ctx context.Context) ([]Lag, error) {
	out := make([]Lag, 0, len(c.tenants))
	for _, tenant := range c.tenants {
		if c.isRetired(tenant) {
			continue
		}
		info, err := c.cons[tenant].Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("queue: look up consumer %s: %w", consumerName(c.cfg, tenant), err)
		}
		c.noteAckWait(info)
		pending, inFlight, err := c.oldLag(ctx, tenant)
		if err != nil {
			return nil, err
		}
		out = append(out, Lag{Tenant: tenant, Pending: info.NumPending + pending, AckPending: uint64(max(info.NumAckPending, 0)) + inFlight,
			MaxAckPending: info.Config.MaxAckPending, ConfigMismatch: c.concurrency.check(ctx, tenant, info.Config.MaxAckPending)})
	}
	return out, nil
}

// Tenants are the tenants whose jobs the consumer fetches, in name order: not those setup
// retired while the worker ran.
func (c *Consumer) Tenants() []string {
	return slices.DeleteFunc(slices.Clone(c.tenants), c.isRetired)
}
