package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
)

// Admin declares what workers and clients bind to: the job stream and its consumer, the
// dead-letter stream and the status and approvals buckets. It needs the operator's rights
// ($JS.API.STREAM.CREATE and the like); a worker without them binds to what an Admin made.
type Admin struct {
	js      jetstream.JetStream
	cfg     config.NATS
	tenants map[string]int           // tenant → its consumer's max_ack_pending
	config  map[string]config.Tenant // the tenants: section, for each tenant's queue bounds
	log     *slog.Logger
	// worker marks a worker's Admin (Open): it keeps what only `worker setup` decides, so that
	// workers whose configs differ do not undo each other at each start. It creates a missing
	// consumer and never changes an existing one's max_ack_pending or ack wait, and it keeps
	// every tenant the job stream takes (tenantsKept).
	worker bool
	// afterHeld, when set (tests), runs after retireJob read how far a job's consumer
	// delivered, before it ends the job: where a worker's claim may come between.
	afterHeld func(Ref)
}

// NewAdmin returns an Admin on the connection for the tenants of the worker config (nil: the
// one tenant default); it declares nothing until Declare. Its Declare sets each tenant's
// consumer's max_ack_pending from the config, as `worker setup` does.
func NewAdmin(nc *nats.Conn, cfg config.NATS, tenants map[string]config.Tenant, log *slog.Logger) (*Admin, error) {
	js, err := newJetStream(nc)
	if err != nil {
		return nil, err
	}
	return &Admin{js: js, cfg: cfg, tenants: tenantsOrDefault(cfg, tenants), config: tenants, log: log}, nil
}

// declareRefusals are the requests of Declare whose refusal is permanent for its login: those
// that list, create, update or remove streams, consumers and messages. A refused look-up of a
// shared bucket or stream an older Boxcar wrote is none there (sharedStream), and Declare goes
// on.
var declareRefusals = []string{"$JS.API.STREAM.LIST", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.CREATE.>", "$JS.API.STREAM.UPDATE.>",
	"$JS.API.STREAM.DELETE.>", "$JS.API.STREAM.MSG.DELETE.>", "$JS.API.CONSUMER.CREATE.>", "$JS.API.CONSUMER.DURABLE.CREATE.>", "$JS.API.CONSUMER.DELETE.>"}

// DeclareUnlessRefused is Declare for `worker setup`: the server's refusal of one of
// declareRefusals shows on the connection alone, and Declare waited for its reply until ctx's
// deadline, as if JetStream did not answer; it ends at the refusal now, ErrRefused, with the
// server's words, which name the subject.
func (a *Admin) DeclareUnlessRefused(ctx context.Context) error {
	nc := a.js.Conn()
	err := unlessRefused(ctx, nc, declareRefusals, a.Declare)
	if errors.Is(err, ErrRefused) {
		return fmt.Errorf("%w: %v", ErrRefused, nc.LastError())
	}
	return err
}

// Declare creates or updates the streams (one per tenant, the shared one, the dead-letter
// one), one consumer per tenant and the buckets. It is safe to call from every worker at start
// and again at any time: a limit an operator edited is kept (streams.go).
func (a *Admin) Declare(ctx context.Context) error {
	err := a.declare(ctx)
	var api *jetstream.APIError
	if errors.As(err, &api) && api.ErrorCode == errCodeInsufficientResources {
		return fmt.Errorf("%w: the server's JetStream storage limit is below the max_bytes its streams reserve (about %d MiB a tenant: nats.job_max_bytes, dead_letter_max_bytes, cancel_max_bytes, approvals_max_bytes); lower those, or raise the server's max_file_store (unset, it is three quarters of its disk's free space when it starts), or free disk", err, reservedPerTenant(a.cfg)>>20)
	}
	return err
}

// errCodeInsufficientResources is JetStream's error code for a stream whose max_bytes does not
// fit what the server may still store.
const errCodeInsufficientResources jetstream.ErrorCode = 10047

// reservedPerTenant is what a tenant's streams and buckets reserve of the server's storage.
func reservedPerTenant(cfg config.NATS) int64 {
	return cfg.JobMaxBytes + cfg.DeadLetterMaxBytes + cfg.CancelMaxBytes + cfg.ApprovalsMaxBytes
}

// declare is Declare without the hint on storage.
func (a *Admin) declare(ctx context.Context) error {
	cfg := a.cfg
	streams, err := a.declareStreams(ctx)
	if err != nil {
		return err
	}
	for _, tenant := range slices.Sorted(maps.Keys(streams)) {
		if err := a.declareConsumer(ctx, streams[tenant], tenant); err != nil {
			return err
		}
	}
	if err := a.declareStatuses(ctx, slices.Sorted(maps.Keys(streams))); err != nil {
		return err
	}
	if err := a.setUpCancel(ctx, slices.Sorted(maps.Keys(streams))); err != nil {
		return err
	}
	// The buckets a worker without the right to create them must find: the tokens each tenant
	// spent, and the profiles it advertises. The profiles live in memory, which a server may
	// not offer (max_memory_store 0): submit then checks no profile, and nothing else is lost,
	// so that one is said and not fatal.
	if err := a.declareUsage(ctx, slices.Sorted(maps.Keys(streams))); err != nil {
		return err
	}
	if _, err := declareBucket(ctx, a.js, profilesBucketConfig(cfg.Replicas)); err != nil {
		a.log.WarnContext(ctx, "cannot set up the profiles bucket; workers will not advertise their profiles and submit will not check them", "bucket", ProfilesBucket, "error", err)
	}
	return a.setUpApprovals(ctx, slices.Sorted(maps.Keys(streams)))
}

// declareStreams creates or updates each kept tenant's job stream, the shared stream and the
// dead-letter streams (deadletters.go), and returns the kept tenants' streams by tenant. The jobs an older
// Boxcar queued in the shared stream stay there, and the shared stream stops taking jobs
// first: the server refuses a stream whose subjects overlap another's (drain.go).
func (a *Admin) declareStreams(ctx context.Context) (map[string]jetstream.Stream, error) {
	if !a.worker {
		if err := a.recordRetired(ctx); err != nil {
			return nil, err
		}
	}
	kept, err := a.tenantsKept(ctx)
	if err != nil {
		return nil, err
	}
	if err := a.adoptBareJobs(ctx); err != nil {
		return nil, err
	}
	// Before the retirement, whose letters go there: declared after, a first setup found no
	// stream to letter the retired jobs in, and left them all to the next.
	if err := a.declareDeadLetters(ctx, slices.Sorted(maps.Keys(kept))); err != nil {
		return nil, err
	}
	if err := a.retireUnserved(ctx, kept); err != nil {
		return nil, err
	}
	if err := a.narrowShared(ctx); err != nil {
		return nil, err
	}
	streams := map[string]jetstream.Stream{}
	for _, tenant := range slices.Sorted(maps.Keys(kept)) {
		jobs, err := a.jobStreamOf(ctx, tenant)
		if err != nil {
			return nil, err
		}
		// What workers before the retention settings set, to tell their values from an operator's.
		jobsBefore := jobs
		jobsBefore.MaxMsgs, jobsBefore.MaxBytes = -1, -1
		s, err := ensureStream(ctx, a.js, jobs, jobsBefore, a.log)
		if err != nil {
			return nil, fmt.Errorf("queue: set up stream %s of tenant %s: %w (if the stream exists with incompatible settings, remove it with `nats stream rm %s` after draining it)", jobs.Name, tenant, err, jobs.Name)
		}
		streams[tenant] = s
	}
	if err := a.moveStranded(ctx, streams); err != nil {
		return nil, err
	}
	return streams, nil
}

// jobStreamConfig is one tenant's job stream. Its bounds, the tenant's max_queued and
// max_queued_bytes or else nats.job_max_msgs and nats.job_max_bytes, are the tenant's alone: a
// tenant that fills its queue is refused its next job (ErrFull), and every other tenant's
// submissions go on. Its metadata names the settings the bounds come from, for the refused
// submitter to read (boundSettings).
func jobStreamConfig(cfg config.NATS, tenant string, t config.Tenant) jetstream.StreamConfig {
	msgs, bytes := boundSettings(tenant, t)
	return jetstream.StreamConfig{
		Name:        jobStream(cfg, tenant),
		Description: "Boxcar jobs of tenant " + tenant,
		// boxcar.jobs.T.J: the subject names the job, and a server permission the tenant.
		Subjects:   []string{tenantFilter(cfg, tenant)},
		Retention:  jetstream.WorkQueuePolicy,
		Storage:    jetstream.FileStorage,
		Replicas:   cfg.Replicas,
		Duplicates: time.Duration(cfg.DuplicateWindow),
		MaxMsgSize: job.MaxMessageBytes + 4096, // room for headers
		MaxMsgs:    orUnlimited(cmp.Or(t.MaxQueued, cfg.JobMaxMsgs)),
		MaxBytes:   orUnlimited(cmp.Or(t.MaxQueuedBytes, cfg.JobMaxBytes)),
		Metadata:   map[string]string{settingMeta("max_msgs"): msgs, settingMeta("max_bytes"): bytes},
		// A full queue refuses the submission, which submit reports; it never drops a job
		// that was accepted.
		Discard: jetstream.DiscardNew,
		// One message per job subject: a second publish of a job that is queued or running is
		// refused, which the client reports as a duplicate. This, not the Nats-Msg-Id header
		// (which the server checks against nothing, so a tenant could set another tenant's),
		// is what makes a re-submission of a job id run it once.
		MaxMsgsPerSubject:    1,
		DiscardNewPerSubject: true,
		// Each job stored is announced, headers only, to the workers (wake.go).
		RePublish: republish(cfg.Subject, tenant),
	}
}

// jobStreamOf is the job stream to declare for tenant: jobStreamConfig, marked as setup's for
// `worker setup` (boundowner.go). A worker's Admin leaves the bounds, and the settings they
// come from, as an existing stream has them where setup set them, and for a tenant it keeps
// without serving it (its tenants: differs from the fleet's, tenantsKept): this worker's
// config does not hold the tenant's max_queued, and setting nats.job_max_msgs instead would
// undo `worker setup`'s at every start of such a worker.
func (a *Admin) jobStreamOf(ctx context.Context, tenant string) (jetstream.StreamConfig, error) {
	want := jobStreamConfig(a.cfg, tenant, a.config[tenant])
	_, ours := a.tenants[tenant]
	err := a.ownedStream(ctx, jobStreamBounds, &want, ours, "tenant", tenant)
	return want, err
}

// removeShared removes the one consumer all tenants' jobs went through before tenants: on a
// work-queue stream it overlaps every tenant's and would keep them from being made. The jobs it
// had not settled stay in the stream, and the tenant's consumer delivers them from their first
// delivery (a job in flight on a worker of the old version may run twice: docs/operations.md
// says to stop those first; one it committed before is found committed, runner's
// AdoptRootLayout).
func (a *Admin) removeShared(ctx context.Context, stream jetstream.Stream) error {
	c, err := stream.Consumer(ctx, a.cfg.Consumer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("queue: look up consumer %s: %w", a.cfg.Consumer, err)
	}
	old := c.CachedInfo().Config
	if err := stream.DeleteConsumer(ctx, a.cfg.Consumer); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("queue: remove the shared consumer %s of an older Boxcar: %w", a.cfg.Consumer, err)
	}
	a.log.Warn("removed the consumer all tenants shared (an older Boxcar's); each tenant has its own now, which delivers the jobs left in the stream again",
		"consumer", a.cfg.Consumer, "old_max_deliver", old.MaxDeliver, "tenants", len(a.tenants))
	return nil
}

// declareConsumer creates or updates one tenant's durable consumer: its jobs only, at most
// its max_concurrent in flight across the fleet, so that one tenant's burst leaves the
// workers' other slots to the other tenants.
func (a *Admin) declareConsumer(ctx context.Context, stream jetstream.Stream, tenant string) error {
	cfg := a.cfg
	name := consumerName(cfg, tenant)
	filters := []string{tenantFilter(cfg, tenant)}
	bound, ackWait, err := a.boundsOf(ctx, stream, tenant)
	if err != nil {
		return err
	}
	_, err = stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:        name,
		Description:    "Boxcar workers, jobs of tenant " + tenant,
		FilterSubjects: filters,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        ackWait,
		// Unbounded on the server: the worker decides from the delivery count (see
		// Delivery.Exhausted), so a job whose last delivery died is delivered once more and
		// dead-lettered by whoever gets it, even when every worker was down at the time. The
		// server's own max-deliveries end is an at-most-once advisory that nothing stores.
		MaxDeliver:    -1,
		MaxAckPending: bound,
		Replicas:      cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("queue: set up consumer %s: %w (if it cannot be updated, remove it with `nats consumer rm %s %s` while no worker runs; jobs stay in the stream)", name, err, jobStream(cfg, tenant), name)
	}
	return nil
}

// boundsOf is the max_ack_pending and ack wait to declare tenant's consumer with: the
// config's, or for a worker's Admin the ones the consumer has on the server, when it exists.
// One value of each serves the whole fleet; the Consumer that binds to it says when its config
// differs (tenantConcurrency, ackWaits).
func (a *Admin) boundsOf(ctx context.Context, stream jetstream.Stream, tenant string) (int, time.Duration, error) {
	want, wantWait := cmp.Or(a.tenants[tenant], a.cfg.MaxAckPending), time.Duration(a.cfg.AckWait)
	if !a.worker {
		return want, wantWait, nil
	}
	name := consumerName(a.cfg, tenant)
	c, err := stream.Consumer(ctx, name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		// A tenant's first stream of its own: its consumer on the shared stream, an older
		// Boxcar's, holds what setup decided.
		c, err = a.js.Consumer(ctx, a.cfg.Stream, name)
	}
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		return want, wantWait, nil
	case err != nil:
		return 0, 0, fmt.Errorf("queue: look up consumer %s: %w", name, err)
	}
	server := c.CachedInfo().Config
	return server.MaxAckPending, server.AckWait, nil
}
