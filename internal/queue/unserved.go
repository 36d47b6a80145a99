package queue

import (
	"context"
	"encoding/json"
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

// ReasonUnknownTenant is the dead letter's reason for a job of a tenant the workers do not
// serve.
const ReasonUnknownTenant = "unknown_tenant"

// jobSubjects are the job stream's subjects: one per tenant served, boxcar.jobs.T.*. A job
// published for any other tenant finds no stream, and its publisher is told at once (a client
// checks first, ErrNotServed); nothing is stored that no worker would ever take.
func jobSubjects(cfg config.NATS, tenants map[string]bool) []string {
	var out []string
	for _, tenant := range slices.Sorted(maps.Keys(tenants)) {
		out = append(out, tenantFilter(cfg, tenant))
	}
	return out
}

// tenantsKept are the tenants whose jobs the job stream takes after Declare: the config's,
// and for a worker's Admin also every tenant the stream takes now, less those setup recorded
// as retired (retired.go). Only `worker setup` retires a tenant: a worker whose tenants: lacks
// one (a config not rolled out everywhere yet) says so and leaves its jobs to the workers that
// serve it, rather than dead-letter them and have the next of those workers declare the tenant
// again; and a worker whose tenants: still lists a retired one does not declare it again.
func (a *Admin) tenantsKept(ctx context.Context) (map[string]bool, error) {
	kept := map[string]bool{}
	for tenant := range a.tenants {
		kept[tenant] = true
	}
	if !a.worker {
		return kept, nil
	}
	s, err := a.js.Stream(ctx, a.cfg.Stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return kept, nil
	case err != nil:
		return nil, fmt.Errorf("queue: look up stream %s: %w", a.cfg.Stream, err)
	}
	retired := retiredIn(s.CachedInfo().Config)
	for tenant := range retired {
		delete(kept, tenant) // the Consumer says so (servedOf)
	}
	var others []string
	for _, tenant := range subjectTenants(a.cfg, s.CachedInfo().Config.Subjects) {
		if kept[tenant] || retired[tenant] {
			continue // ours, or retired (put back by a worker that did not know the record)
		}
		kept[tenant] = true
		others = append(others, tenant)
	}
	if len(others) > 0 {
		a.log.WarnContext(ctx, "the job stream takes jobs of tenants this worker's tenants: does not list; it leaves them to the workers that serve them. Every worker must have the same tenants: (run `worker setup` with the deployment's config to retire a tenant)",
			"stream", a.cfg.Stream, "tenants", others)
	}
	return kept, nil
}

// retireUnserved ends what the job stream holds for tenants the config does not list (a tenant
// removed from it, or jobs a stream with every tenant's subjects took): each job is
// dead-lettered as unknown_tenant, with its message, and removed; the consumers of those
// tenants are removed. Nothing is lost and nothing waits forever for a worker that will never
// come; the log says how many. A job a worker runs (its status says running) is left to its
// run, which ends it once, and so is its tenant's consumer, through which the worker acks it
// (or, should the worker die, delivers it again to a worker that still serves the tenant):
// dead-lettered under it, the job ended twice, committed by its run and dead-lettered here.
// The next `worker setup` retires what is left.
func (a *Admin) retireUnserved(ctx context.Context, kept map[string]bool) error {
	s, err := a.js.Stream(ctx, a.cfg.Stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("queue: look up stream %s: %w", a.cfg.Stream, err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(a.cfg.Subject+".>"))
	if err != nil {
		return fmt.Errorf("queue: list the subjects of stream %s: %w", a.cfg.Stream, err)
	}
	running, err := a.runningOf(ctx)
	if err != nil {
		return err
	}
	dead, left := 0, map[string]int{}
	for subject := range info.State.Subjects {
		r := refOf(strings.TrimPrefix(subject, a.cfg.Subject+"."))
		if kept[r.Tenant] {
			continue
		}
		if running(r) {
			left[r.Tenant]++
			continue
		}
		n, err := a.deadLetterAll(ctx, s, subject, r)
		dead += n
		if err != nil {
			return err
		}
	}
	if len(left) > 0 {
		a.log.WarnContext(ctx, "left the running jobs of tenants the config does not list to their workers, and those tenants' consumers; run `worker setup` again once they ended to remove the consumers",
			"stream", a.cfg.Stream, "running", left)
	}
	gone, err := a.removeConsumers(ctx, s, func(tenant string) bool { return kept[tenant] || left[tenant] > 0 })
	if err != nil {
		return err
	}
	if dead > 0 || len(gone) > 0 {
		a.log.WarnContext(ctx, "dead-lettered the jobs of tenants the config does not list, and removed their consumers", "stream", a.cfg.Stream,
			"reason", ReasonUnknownTenant, "jobs", dead, "consumers", gone, "tenants", slices.Sorted(maps.Keys(kept)))
	}
	return nil
}

// removeConsumers removes the tenants' consumers but those keep says to keep, and returns the
// names of those it removed.
func (a *Admin) removeConsumers(ctx context.Context, s jetstream.Stream, keep func(tenant string) bool) ([]string, error) {
	var gone []string
	for name := range s.ListConsumers(ctx).Info() {
		tenant, ok := strings.CutPrefix(name.Name, a.cfg.Consumer+"-")
		if !ok || keep(tenant) {
			continue
		}
		if err := s.DeleteConsumer(ctx, name.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return gone, fmt.Errorf("queue: remove consumer %s of tenant %s, which the config does not list: %w", name.Name, tenant, err)
		}
		gone = append(gone, name.Name)
	}
	return gone, nil
}

// runningOf returns whether a job's status says a worker runs it. Without the status bucket
// (a stream set up by hand) no job does.
func (a *Admin) runningOf(ctx context.Context) (func(Ref) bool, error) {
	kv, err := a.js.KeyValue(ctx, a.cfg.StatusBucket)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
		return func(Ref) bool { return false }, nil
	case err != nil:
		return nil, fmt.Errorf("queue: look up bucket %s: %w", a.cfg.StatusBucket, err)
	}
	return func(r Ref) bool {
		st, err := getStatus(ctx, kv, r)
		// A status that cannot be read is not known to be running: its job is retired as before.
		return err == nil && st.State == job.StateRunning
	}, nil
}

// deadLetterAll dead-letters every message on one job subject as unknown_tenant and removes it.
func (a *Admin) deadLetterAll(ctx context.Context, s jetstream.Stream, subject string, r Ref) (int, error) {
	n := 0
	for seq := uint64(1); ; n++ {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("queue: read job %s: %w", subject, err)
		}
		dl, err := json.Marshal(DeadLetter{Tenant: r.Tenant, JobID: r.ID, Reason: ReasonUnknownTenant, At: time.Now().UTC(), Original: m.Data,
			Error: fmt.Sprintf("%v %q: the workers serve %s; add it to tenants: in the worker config, run `worker setup`, and submit the job again",
				ErrNotServed, r.Tenant, strings.Join(slices.Sorted(maps.Keys(a.tenants)), ", "))})
		if err != nil {
			return n, fmt.Errorf("queue: encode dead letter: %w", err)
		}
		to := dlqSubject(a.cfg, r)
		if _, err := a.js.Publish(ctx, to, dl, jetstream.WithExpectLastSequencePerSubject(0)); err != nil && !isWrongLastSequence(err) {
			return n, fmt.Errorf("queue: dead-letter job %s: %w", subject, err)
		}
		if err := s.DeleteMsg(ctx, m.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return n, fmt.Errorf("queue: remove job %s once dead-lettered: %w", subject, err)
		}
		seq = m.Sequence + 1
	}
}
