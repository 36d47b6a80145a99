package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
)

// ReasonUnknownTenant is the dead letter's reason for a job of a tenant the workers do not
// serve.
const ReasonUnknownTenant = "unknown_tenant"

// reasonInvalidJob is the dead letter's reason for a message that can never run as it is, as
// the runner writes it.
const reasonInvalidJob = "invalid_job"

// jobStreams returns the job streams the server has, by name: the shared stream and each
// tenant's (jobStream), whichever tenant's it is; a stream of any other name is not Boxcar's.
func (a *Admin) jobStreams(ctx context.Context) (map[string]*jetstream.StreamInfo, error) {
	out := map[string]*jetstream.StreamInfo{}
	list := a.js.ListStreams(ctx)
	for info := range list.Info() {
		if info.Config.Name == a.cfg.Stream || a.tenantOf(info.Config.Name) != "" {
			out[info.Config.Name] = info
		}
	}
	if err := list.Err(); err != nil {
		return nil, fmt.Errorf("queue: list the job streams: %w", err)
	}
	return out, nil
}

// tenantOf is the tenant whose job stream is named stream; "" for a name of another shape.
func (a *Admin) tenantOf(stream string) string {
	tenant, ok := strings.CutPrefix(stream, a.cfg.Stream+"_")
	if !ok || !job.ValidTenant(tenant) {
		return ""
	}
	return tenant
}

// takenTenants are the tenants whose jobs the job streams take, by their subjects.
func takenTenants(cfg config.NATS, streams map[string]*jetstream.StreamInfo) []string {
	var out []string
	for _, info := range streams {
		out = append(out, subjectTenants(cfg, info.Config.Subjects)...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// tenantsKept are the tenants that have a job stream after Declare: the config's, and for a
// worker's Admin also every tenant a job stream takes now, less those setup recorded as
// retired (retired.go). Only `worker setup` retires a tenant: a worker whose tenants: lacks
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
	streams, err := a.jobStreams(ctx)
	if err != nil {
		return nil, err
	}
	retired := map[string]bool{}
	if shared, ok := streams[a.cfg.Stream]; ok {
		retired = retiredIn(shared.Config)
	}
	for tenant := range retired {
		delete(kept, tenant) // the Consumer says so (servedOf)
	}
	var others []string
	for _, tenant := range takenTenants(a.cfg, streams) {
		if kept[tenant] || retired[tenant] {
			continue // ours, or retired (put back by a worker that did not know the record)
		}
		kept[tenant] = true
		others = append(others, tenant)
	}
	if len(others) > 0 {
		a.log.WarnContext(ctx, "job streams take jobs of tenants this worker's tenants: does not list; it leaves them to the workers that serve them. Every worker must have the same tenants: (run `worker setup` with the deployment's config to retire a tenant)",
			"stream", a.cfg.Stream, "tenants", others)
	}
	return kept, nil
}

// retireUnserved ends what the job streams hold for tenants the config does not list (a tenant
// removed from it, or jobs the shared stream took for every tenant): each job is dead-lettered
// as unknown_tenant, with its message, and removed; the consumers of those tenants are
// removed, and so is the stream of such a tenant. Nothing is lost and nothing waits forever
// for a worker that will never come; the log says how many. A job a worker runs (its status
// says running, or the tenant's consumer delivered it and its status records no end: retireJob)
// is left to its run, which ends it once, and so is its tenant's consumer,
// through which the worker acks it (or, should the worker die, delivers it again to a worker
// that still serves the tenant): dead-lettered under it, the job ended twice, committed by its
// run and dead-lettered here. The tenant's stream then takes no new job (retiredSubject). The
// next `worker setup` retires what is left.
func (a *Admin) retireUnserved(ctx context.Context, kept map[string]bool) error {
	streams, err := a.jobStreams(ctx)
	if err != nil {
		return err
	}
	stateOf := a.stateOf(ctx)
	for _, name := range slices.Sorted(maps.Keys(streams)) {
		tenant := a.tenantOf(name)
		if tenant != "" && kept[tenant] {
			continue
		}
		s, err := a.js.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("queue: look up stream %s: %w", name, err)
		}
		left, err := a.retireIn(ctx, s, kept, stateOf)
		if err != nil {
			return err
		}
		if tenant == "" {
			continue // the shared stream stays (drain.go)
		}
		if err := a.retireStream(ctx, s, tenant, left); err != nil {
			return err
		}
	}
	return nil
}

// retireStream removes the stream of a tenant the config does not list once it holds nothing,
// or else makes it take no new job while the jobs left run.
func (a *Admin) retireStream(ctx context.Context, s jetstream.Stream, tenant string, left int) error {
	name := s.CachedInfo().Config.Name
	if left == 0 {
		if err := a.js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("queue: remove stream %s of tenant %s, which the config does not list: %w", name, tenant, err)
		}
		a.log.WarnContext(ctx, "removed the job stream of a tenant the config does not list", "stream", name, "tenant", tenant)
		return nil
	}
	cfg := s.CachedInfo().Config
	if slices.Equal(cfg.Subjects, []string{retiredSubject(a.cfg, tenant)}) {
		return nil
	}
	cfg.Subjects, cfg.RePublish = []string{retiredSubject(a.cfg, tenant)}, nil
	if _, err := a.js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("queue: stop stream %s taking jobs of tenant %s, which the config does not list: %w", name, tenant, err)
	}
	return nil
}

// retireIn is retireUnserved's for one job stream: it returns how many jobs it left to their run,
// or to the next setup (a status it cannot read now).
func (a *Admin) retireIn(ctx context.Context, s jetstream.Stream, kept map[string]bool, stateOf func(Ref) (seen, error)) (int, error) {
	stream := s.CachedInfo().Config.Name
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(a.cfg.Subject+".>"))
	if err != nil {
		return 0, fmt.Errorf("queue: list the subjects of stream %s: %w", stream, err)
	}
	dead, left, unlettered := 0, map[string]int{}, map[string]bool{}
	held := a.heldUpTo(ctx, s)
	for subject := range info.State.Subjects {
		r := refOf(strings.TrimPrefix(subject, a.cfg.Subject+"."))
		switch {
		case kept[r.Tenant]:
		case unlettered[r.Tenant]:
			left[r.Tenant]++ // its letters are not written now: each would wait as long
		default:
			n, err := a.retireJob(ctx, s, subject, r, stateOf, held)
			dead += n
			if err != nil {
				// One tenant's letters not written now (its dead-letter stream electing its
				// leader) fail neither setup nor another tenant's retirement.
				unlettered[r.Tenant] = !errors.Is(err, errLeft)
				left[r.Tenant]++
			}
		}
	}
	if len(left) > 0 {
		a.log.WarnContext(ctx, "left the running jobs of tenants the config does not list to their workers, and those tenants' consumers; run `worker setup` again once they ended to remove the consumers",
			"stream", stream, "running", left)
	}
	gone, err := a.removeConsumers(ctx, s, func(tenant string) bool { return kept[tenant] || left[tenant] > 0 })
	if err != nil {
		return 0, err
	}
	if dead > 0 || len(gone) > 0 {
		a.log.WarnContext(ctx, "dead-lettered the jobs of tenants the config does not list, and removed their consumers", "stream", stream,
			"reason", ReasonUnknownTenant, "jobs", dead, "consumers", gone, "tenants", slices.Sorted(maps.Keys(kept)))
	}
	total := 0
	for _, n := range left {
		total += n
	}
	return total, nil
}

// heldUpTo returns the last stream sequence the consumer of a job's tenant on s delivered: a
// message at or below it that is still in the stream may be held by a worker. No consumer: 0.
// It is read for each job, after the job's status (retireJob): read once for a tenant, a
// worker of the old config that fetched a later job meanwhile held a job setup took as never
// delivered, and dead-lettered and removed while the worker ran it.
func (a *Admin) heldUpTo(ctx context.Context, s jetstream.Stream) func(Ref) (uint64, error) {
	return func(r Ref) (uint64, error) {
		c, err := s.Consumer(ctx, consumerName(a.cfg, r.Tenant))
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			return 0, nil
		case err != nil:
			return 0, fmt.Errorf("queue: look up consumer %s: %w", consumerName(a.cfg, r.Tenant), err)
		}
		return c.CachedInfo().Delivered.Stream, nil
	}
}

// errLeft: retireJob leaves the job to its run, or to the next setup.
var errLeft = errors.New("the job is left in its stream")

// retireJob ends job r (its messages on subject) of a tenant the config does not list and
// returns how many messages it dead-lettered. It leaves a job whose status says it runs, or
// that it cannot read now, and one whose status says no end while its tenant's consumer has
// delivered it (held: a worker may hold it, its claim not yet past the running status) (all
// errLeft); it removes, with no dead letter, the message of a job that ended as its worker acks
// it (endedAcked), unless the consumer delivered it (errLeft). Another error: it cannot
// dead-letter the job now.
func (a *Admin) retireJob(ctx context.Context, s jetstream.Stream, subject string, r Ref, stateOf func(Ref) (seen, error), held func(Ref) (uint64, error)) (int, error) {
	stream := s.CachedInfo().Config.Name
	got, err := stateOf(r)
	state := got.status.State
	var upTo uint64
	if err == nil && (!state.Terminal() || endedAcked(state)) {
		upTo, err = held(r)
	}
	if a.afterHeld != nil {
		a.afterHeld(r)
	}
	switch {
	case err != nil:
		a.log.WarnContext(ctx, "cannot tell whether a job of a tenant the config does not list runs; it is left in its stream, and the next `worker setup` retires it",
			"stream", stream, "tenant", r.Tenant, "job_id", r.ID, "error", err)
		return 0, errLeft
	case state == job.StateRunning:
		return 0, errLeft
	case endedAcked(state):
		// Delivered, its worker may be alive, between its status and its ack: removed, with
		// the consumer when it was the tenant's last, its ack waited for an answer until the
		// attempt's deadline. Left, its worker acks it, or, gone, the sweep does (ErrFinal).
		if _, err := a.deadLetterAll(ctx, s, r, subject, upTo, nil, nil); err != nil {
			return 0, errLeft // the next setup removes it
		}
		a.log.InfoContext(ctx, "removed the message of a job of a tenant the config does not list that ended, its worker stopped before its ack; no dead letter",
			"stream", stream, "tenant", r.Tenant, "job_id", r.ID, "state", string(state))
		return 0, nil
	}
	letter := func(m *jetstream.RawStreamMsg) error { return a.letterUnserved(ctx, subject, r, m, got.status) }
	n, err := a.deadLetterAll(ctx, s, r, subject, upTo, letter, func() error { return a.endJob(ctx, r, got) })
	if errors.Is(err, errClaimed) {
		a.log.InfoContext(ctx, "a worker claimed a job of a tenant the config does not list while setup looked at it; it is left to its run",
			"stream", stream, "tenant", r.Tenant, "job_id", r.ID)
		return n, errLeft
	}
	if err != nil && !errors.Is(err, errLeft) {
		a.log.WarnContext(ctx, "cannot dead-letter the jobs of a tenant the config does not list; they are left in its stream, and the next `worker setup` retires them",
			"stream", stream, "tenant", r.Tenant, "job_id", r.ID, "error", err)
	}
	return n, err
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

// seen is what setup read of a job's status: the status (the zero one when there is none), and
// the tenant's bucket with the key's revision there (0: none), for the compare-and-set of the
// job's end (endJob). kv is nil when the tenant has no status bucket. With no status in the
// tenant's bucket, shared is the shared bucket an older worker of an upgrade writes (nil: there
// is none) and sharedRev the sequence of the key's last message there (0: none), for the same.
type seen struct {
	status    job.Status
	rev       uint64
	kv        casStore
	shared    *sharedBucket
	sharedRev uint64
}

// stateOf returns what a job's status says: its tenant's status bucket, else the shared one an
// older worker may have written (statusbuckets.go). Without either (a stream set up by hand) a
// job has none. A status it cannot read is an error, not a job that does not run: the shared
// bucket's stream answering nobody (its leader being elected) is none only when the server says
// the stream is gone (sharedBucket.lookup), and a job taken as not running is dead-lettered and
// removed while its worker runs it. The shared bucket is asked only for a job whose status its
// tenant's bucket does not hold: looked up before any job needed it, its one failed look-up
// failed the whole setup, and every worker's start.
func (a *Admin) stateOf(ctx context.Context) func(Ref) (seen, error) {
	b := newTenantBuckets(a.js, a.cfg.StatusBucket, "status")
	b.shared.asWorker = true
	return func(r Ref) (seen, error) {
		if !job.ValidID(r.ID) {
			return seen{}, nil // no status is kept under it
		}
		var out seen
		kv, err := b.of(ctx, r.Tenant)
		switch {
		case err == nil:
			out.kv = kv
			if out.status, out.rev, err = read[job.Status](ctx, kv, r.key()); err != nil {
				return seen{}, fmt.Errorf("queue: status of %s: %w", r, err)
			}
		case !errors.Is(err, ErrNotReady):
			return seen{}, err
		}
		if out.rev == 0 {
			// A worker's claim adopts this one into the tenant's bucket: a create there, which
			// makes setup's create fail as its own does. An older worker's claim writes here
			// alone.
			if err := readShared(ctx, b.shared, r.key(), &out); err != nil {
				return seen{}, fmt.Errorf("queue: status of %s: %w", r, err)
			}
		}
		return out, nil
	}
}

// readShared reads key's status in the shared bucket into out, with the sequence of the key's
// last message (a delete marker's too), which a compare-and-set of the key is made at.
func readShared(ctx context.Context, shared *sharedBucket, key string, out *seen) error {
	msg, err := shared.stream.lookup(ctx, shared.js, "$KV."+shared.bucket+"."+key)
	if err != nil {
		return fmt.Errorf("read %s in the shared status bucket %s: %w", key, shared.bucket, err)
	}
	if msg == nil && shared.stream.absent() {
		return nil // no shared bucket (gone, or this login may not read it): no older worker writes one
	}
	out.shared = shared
	if msg == nil {
		return nil
	}
	out.sharedRev, _ = strconv.ParseUint(msg.Header.Get(jetstream.SequenceHeader), 10, 64)
	if msg.Header.Get("KV-Operation") != "" {
		return nil // a delete or purge marker is no status
	}
	if err := json.Unmarshal(msg.Data, &out.status); err != nil {
		return fmt.Errorf("decode %s in the shared status bucket %s: %w", key, shared.bucket, err)
	}
	return nil
}

// errClaimed: a write changed the job's status since setup read it (a worker's claim).
var errClaimed = errors.New("a worker wrote the job's status since setup read it")

// endJob writes job r's end, dead as unknown_tenant, with a compare-and-set of the status setup
// read (s), before setup dead-letters and removes its message. A worker that claimed the job
// in between (its consumer delivered it after setup read how far it delivered) wrote its
// running status, which makes this write fail (errClaimed): setup leaves the job to that
// worker. A worker that fetches the job after it finds the job ended and terms its delivery,
// writing the dead letter should setup have stopped before it (the runner's endedOutcome).
// An older worker of an upgrade claims in the shared bucket alone: with no status in the
// tenant's bucket, the end is written there first, at the revision setup read there (with it
// written in the tenant's bucket alone, the older worker's claim did not stop setup, and the
// job it ran was dead-lettered and removed, TestSetupLeavesAJobAnOlderWorkerClaimedAfterItsRead).
func (a *Admin) endJob(ctx context.Context, r Ref, s seen) error {
	if (s.kv == nil && s.shared == nil) || s.status.State.Terminal() {
		return nil
	}
	st := s.status
	st.ID, st.State, st.Ending, st.Error = r.ID, job.StateDead, "", ReasonUnknownTenant+": "+a.unservedError(r)
	st.FinishedAt = time.Now().UTC()
	st.UpdatedAt = st.FinishedAt
	data, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("queue: encode the status of %s: %w", r, err)
	}
	if s.shared != nil {
		if _, err := s.shared.Update(ctx, r.key(), data, s.sharedRev); err != nil {
			return endWritten(r, err)
		}
	}
	switch {
	case s.kv == nil:
		return nil
	case s.rev != 0:
		_, err = s.kv.Update(ctx, r.key(), data, s.rev)
	default:
		_, err = s.kv.Create(ctx, r.key(), data)
		if errors.Is(err, jetstream.ErrKeyExists) && s.shared != nil && adoptedEnd(ctx, s.kv, r.key(), data) {
			err = nil // a worker's claim copied setup's end from the shared bucket, and found it ended
		}
	}
	return endWritten(r, err)
}

// endWritten is endJob's answer to a write of the job's end: errClaimed when another write came
// first.
func endWritten(r Ref, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrKeyExists) || isWrongSequence(err):
		return errClaimed
	}
	return fmt.Errorf("queue: write the end of job %s: %w", r, err)
}

// adoptedEnd reports whether kv holds, under key, the end setup wrote in the shared bucket
// (data), as a worker's claim copies it there before it writes (tenantBuckets.adopt).
func adoptedEnd(ctx context.Context, kv casStore, key string, data []byte) bool {
	e, err := kv.Get(ctx, key)
	return err == nil && bytes.Equal(e.Value(), data)
}

// endedAcked reports whether a job whose status says state ended as its worker acks it, with no
// dead letter: its worker stopped before the ack. Dead-lettered by setup, the job ended twice,
// its run's end and unknown_tenant. A job that ended failed, rejected or dead has its worker's
// letter, or none when the worker stopped before it: setup writes one then, and never a second.
func endedAcked(state job.State) bool {
	return state == job.StateSucceeded || state == job.StateCapped || state == job.StateCancelled
}

// deadLetterAll dead-letters every message on one job subject (letter, when set) and removes
// it; a message at a sequence up to held (its consumer delivered it) it
// leaves, and says so (errLeft). A job that has a letter already (its worker wrote it and
// stopped before the term) keeps that one alone. end, when set, writes the job's end before
// the first message goes, unless one was left (a worker holds the job, which ends it): its
// error leaves every message.
func (a *Admin) deadLetterAll(ctx context.Context, s jetstream.Stream, r Ref, subject string, held uint64, letter func(*jetstream.RawStreamMsg) error, end func() error) (int, error) {
	n, leftOne := 0, false
	for seq := uint64(1); ; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound) && leftOne:
			return n, errLeft
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return n, nil
		case err != nil:
			return n, fmt.Errorf("queue: read job %s: %w", subject, err)
		}
		seq = m.Sequence + 1
		if m.Sequence <= held {
			leftOne = true
			continue
		}
		if end != nil && !leftOne {
			if err := end(); err != nil {
				return n, err
			}
		}
		end = nil
		if letter != nil {
			if err := letter(m); err != nil {
				return n, fmt.Errorf("queue: dead-letter job %s: %w", subject, err)
			}
		}
		if err := s.DeleteMsg(ctx, m.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return n, fmt.Errorf("queue: remove job %s of a tenant the config does not list: %w", subject, err)
		}
		n++
	}
}

// letterUnserved writes the unknown_tenant dead letter of job r, its message m on subject,
// where a worker writes the job's (letterWriter): a letter there already is the job's one. A
// job whose status st says it ended with a letter (failed, rejected, dead: its worker, or the
// sweep of a worker that does not serve the tenant, stopped before the letter) gets that end's,
// with the status's reason and error (EndedLetter), as the worker or the sweep would have written it: an unknown_tenant one told another end than its status. A
// subject that names no job (boxcar.jobs.T, boxcar.jobs.T.a.b, which an older shared stream
// took) is no consumer's to deliver, its tenant served or not: its letter is invalid_job, under
// the tenant the subject's first token names and the message's sequence (letterRef), where the
// tenant's submitter reads its letters. Under tenant "" no submitter could.
func (a *Admin) letterUnserved(ctx context.Context, subject string, r Ref, m *jetstream.RawStreamMsg, st job.Status) error {
	reason, why := ReasonUnknownTenant, ""
	if ended, cause, ok := EndedLetter(r.Tenant, st); ok {
		reason, why = ended, cause.Error()
	}
	if r.ID == "" {
		r.Tenant, _, _ = strings.Cut(strings.TrimPrefix(subject, a.cfg.Subject+"."), ".")
		reason = reasonInvalidJob
		why = fmt.Sprintf("%v: the message's subject %s names no job id, so no worker's consumer delivers it; publish the job on %s.%s.<its id> (submit does)",
			job.ErrInvalid, subject, a.cfg.Subject, r.Tenant)
	}
	r = letterRef(r, m.Sequence)
	if why == "" {
		why = a.unservedError(r)
	}
	dl, err := json.Marshal(DeadLetter{Tenant: r.Tenant, JobID: r.ID, Reason: reason, At: time.Now().UTC(), Original: m.Data, Error: why})
	if err != nil {
		return fmt.Errorf("queue: encode dead letter: %w", err)
	}
	_, err = letterWriter{js: a.js, cfg: a.cfg, log: a.log}.publishLetter(ctx, r, dl, false)
	if err != nil && !isWrongLastSequence(err) && !errors.Is(err, errLettered) {
		return err
	}
	return nil
}

// unservedError says why job r of a tenant the config does not list ended, and what to do.
func (a *Admin) unservedError(r Ref) string {
	return fmt.Sprintf("%v %q: the workers serve %s; add it to tenants: in the worker config, run `worker setup`, and submit the job again",
		ErrNotServed, r.Tenant, strings.Join(slices.Sorted(maps.Keys(a.tenants)), ", "))
}
