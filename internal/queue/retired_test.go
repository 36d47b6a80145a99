package queue_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

// declare runs `worker setup`'s Declare for tenants on b's server.
func (b bundle) declare(t *testing.T, tenants map[string]config.Tenant) {
	t.Helper()
	admin, err := queue.NewAdmin(b.nc, b.cfg, tenants, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Declare(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// serves reports whether tenant's job stream takes its jobs and its consumer exists.
func (b bundle) serves(t *testing.T, tenant string) (subject, consumer bool) {
	t.Helper()
	s, err := b.js.Stream(t.Context(), queue.JobStream(b.cfg, tenant))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return false, false
	}
	if err != nil {
		t.Fatal(err)
	}
	subject = slices.Contains(s.CachedInfo().Config.Subjects, b.cfg.Subject+"."+tenant+".*")
	_, err = s.Consumer(t.Context(), b.cfg.Consumer+"-"+tenant)
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatal(err)
	}
	return subject, err == nil
}

// TestRetiredTenantStaysRetired: `worker setup` records the tenants it retires in NATS, and a
// worker of the old config (its tenants: still lists one) that starts afterwards honours the
// record: it declares neither the tenant's subject nor its consumer, serves its other tenants,
// and says once which tenant it leaves out and what to do. Setup with a config that lists the
// tenant again clears the record, and the same worker serves it.
func TestRetiredTenantStaysRetired(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	two := map[string]config.Tenant{"team-a": {}, "team-b": {}}
	b.open(t, b.cfg, two, nil)
	b.declare(t, map[string]config.Tenant{"team-a": {}})

	var wlog bytes.Buffer
	old := b.open(t, b.cfg, two, &wlog)
	if subject, consumer := b.serves(t, "team-b"); subject || consumer {
		t.Errorf("after a worker of the old config started, team-b's subject %v, consumer %v; want neither put back", subject, consumer)
	}
	if got := old.Tenants(); !slices.Equal(got, []string{"team-a"}) {
		t.Errorf("the old config's worker serves %v, want [team-a]", got)
	}
	warnings := strings.Count(wlog.String(), "retired")
	if warnings != 1 || !strings.Contains(wlog.String(), "tenant=team-b") || !strings.Contains(wlog.String(), "worker setup") {
		t.Errorf("the old config's worker logged %d lines about the retired tenant; want one naming team-b and `worker setup`:\n%s", warnings, wlog.String())
	}
	if _, err := queue.NewClient(ctx, b.nc, b.cfg, "team-b"); !errors.Is(err, queue.ErrNotServed) {
		t.Errorf("team-b's client after a worker of the old config started: %v; want ErrNotServed", err)
	}

	// Its consumer gone under a running worker of the old config: the worker does not put it
	// back either (it looks again at its next pull that finds nothing).
	running := b.open(t, b.cfg, two, nil)
	b.declare(t, map[string]config.Tenant{"team-a": {}})
	wait, stop := context.WithTimeout(ctx, 12*time.Second)
	defer stop()
	if _, err := running.Fetch(wait); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("fetch of the running worker: %v; want nothing", err)
	}
	if subject, consumer := b.serves(t, "team-b"); subject || consumer {
		t.Errorf("after a running worker of the old config found team-b's consumer gone, subject %v, consumer %v; want neither put back", subject, consumer)
	}

	b.declare(t, two)
	wlog.Reset()
	again := b.open(t, b.cfg, two, &wlog)
	if subject, consumer := b.serves(t, "team-b"); !subject || !consumer {
		t.Errorf("after setup with team-b listed, its subject %v, consumer %v; want both", subject, consumer)
	}
	if got := again.Tenants(); !slices.Equal(got, []string{"team-a", "team-b"}) || strings.Contains(wlog.String(), "retired") {
		t.Errorf("after setup with team-b listed, the worker serves %v and logged:\n%s\nwant both tenants, no word of a retired one", got, wlog.String())
	}
}

// TestRetiredTenantsJobEndsWhenItsWorkerDies: setup leaves a retired tenant's running job to
// its run, with the tenant's consumer. When the job's worker dies and no worker of the old
// config is left, a worker of the new config ends it once its ack wait passed: the status says
// dead, the dead letter tenant_retired, with the message, and the consumer goes once it holds
// nothing. The dead worker's late write is refused: the job ends once.
func TestRetiredTenantsJobEndsWhenItsWorkerDies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	old, j, d := b.fetchedByOldWorker(t)
	if _, err := old.UpdateStatus(ctx, d.Ref(), func(s *job.Status) { s.State = job.StateRunning; s.Attempt = d.Attempt }, queue.ByAttempt(d.Attempt)); err != nil {
		t.Fatal(err)
	}
	b.declare(t, map[string]config.Tenant{"team-a": {}})
	if _, consumer := b.serves(t, "team-b"); !consumer {
		t.Fatal("setup removed the consumer of team-b's running job; want it left to the run")
	}

	// The worker of the old config dies: no ack, no heartbeat. One of the new config fetches.
	var wlog bytes.Buffer
	fresh := b.open(t, b.cfg, map[string]config.Tenant{"team-a": {}}, &wlog)
	cons, err := b.js.Consumer(ctx, queue.JobStream(b.cfg, "team-b"), b.cfg.Consumer+"-team-b")
	if err != nil {
		t.Fatal(err)
	}
	harness.Wait(t, "team-b's job to be ended", func() (bool, error) {
		fresh.SweepNow()
		wait, stop := context.WithTimeout(ctx, 300*time.Millisecond)
		defer stop()
		if _, err := fresh.Fetch(wait); !errors.Is(err, context.DeadlineExceeded) {
			return false, err
		}
		_, err := cons.Info(ctx)
		return errors.Is(err, jetstream.ErrConsumerNotFound), nil
	}, harness.Within(30*time.Second))
	st, err := b.client(t, "team-b").Status(ctx, j.ID)
	if err != nil || st.State != job.StateDead || !strings.Contains(st.Error, "retired") {
		t.Errorf("status of team-b's job: %+v, %v; want dead, saying its tenant was retired", st, err)
	}
	dl := b.deadLetter(t, queue.Ref{Tenant: "team-b", ID: j.ID})
	if orig, err := job.Decode(dl.Original); dl.Reason != queue.ReasonTenantRetired || dl.JobID != j.ID || err != nil || orig.ID != j.ID {
		t.Errorf("dead letter %+v (%v); want team-b's job, tenant_retired, with its message", dl, err)
	}
	if !strings.Contains(wlog.String(), "job_id="+j.ID) {
		t.Errorf("the worker does not say which job it ended:\n%s", wlog.String())
	}
	if _, err := old.UpdateStatus(ctx, d.Ref(), func(s *job.Status) { s.State = job.StateSucceeded }, queue.ByAttempt(d.Attempt)); !errors.Is(err, queue.ErrFinal) {
		t.Errorf("the dead worker's late status write: %v; want ErrFinal, the job ended once", err)
	}
	if info, err := b.js.Stream(ctx, queue.JobStream(b.cfg, "team-b")); err != nil || info.CachedInfo().State.Msgs != 0 {
		t.Errorf("team-b's job stream holds %v messages (%v); want none", info.CachedInfo().State.Msgs, err)
	}
}

// TestRetiredTenantsJobKeepsItsOneDeadLetter: a worker of team-b ended a job dead, wrote its
// letter into team-b's dead-letter stream and stopped before its term, and team-b is retired.
// What ends the job's message then, setup retiring the tenant (its status says dead, not
// running) or a worker of the new config sweeping what team-b's consumer delivers again, wrote
// a second letter into the shared stream, whose one-a-subject check cannot see team-b's: a job
// of a tenant no worker serves had its letter written there, whoever wrote the first. Every
// writer now offers a job's letter to its tenant's stream first, where the server refuses a
// second one.
func TestRetiredTenantsJobKeepsItsOneDeadLetter(t *testing.T) {
	t.Parallel()
	for _, sweep := range []bool{false, true} {
		name := map[bool]string{false: "setup retiring the tenant", true: "the sweep of a worker of the new config"}[sweep]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := t.Context()
			old, j, d := b.fetchedByOldWorker(t)
			state := func(s job.State) {
				t.Helper()
				if _, err := old.UpdateStatus(ctx, d.Ref(), func(st *job.Status) { st.State, st.Attempt = s, d.Attempt }, queue.ByAttempt(d.Attempt)); err != nil {
					t.Fatal(err)
				}
			}
			state(job.StateRunning)
			var fresh *queue.Consumer
			if sweep { // setup and the new config's worker leave the running job to its run
				b.declare(t, map[string]config.Tenant{"team-a": {}})
				fresh = b.open(t, b.cfg, map[string]config.Tenant{"team-a": {}}, nil)
			}
			// The run ends dead: the status, then the letter, and its worker stops before the term.
			state(job.StateDead)
			own := queue.DeadLetterStream(b.cfg, "team-b")
			data, _ := json.Marshal(queue.DeadLetter{Tenant: "team-b", JobID: j.ID, Reason: "max_deliveries", Attempt: d.Attempt})
			if _, err := b.js.Publish(ctx, own+"."+j.ID, data, jetstream.WithExpectLastSequencePerSubject(0)); err != nil {
				t.Fatal(err)
			}
			if !sweep {
				b.declare(t, map[string]config.Tenant{"team-a": {}})
			} else {
				sweepRetired(t, b, fresh, "team-b")
			}
			if letters := lettersOf(t, b, j.ID, own, b.cfg.DeadLetterStream); len(letters) != 1 || letters[0] != own+"."+j.ID+"×1" {
				t.Errorf("the job's dead letters: %v; want its worker's one, in %s", letters, own)
			}
			if s, err := b.js.Stream(ctx, queue.JobStream(b.cfg, "team-b")); err == nil && s.CachedInfo().State.Msgs != 0 {
				t.Errorf("team-b's job stream holds %d messages; want the job's ended", s.CachedInfo().State.Msgs)
			}
		})
	}
}

// sweepRetired has w sweep what tenant's consumer delivers again until the consumer is gone.
func sweepRetired(t *testing.T, b bundle, w *queue.Consumer, tenant string) {
	t.Helper()
	cons, err := b.js.Consumer(t.Context(), queue.JobStream(b.cfg, tenant), b.cfg.Consumer+"-"+tenant)
	if err != nil {
		t.Fatal(err)
	}
	harness.Wait(t, tenant+"'s job to be ended", func() (bool, error) {
		w.SweepNow()
		wait, stop := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer stop()
		if _, err := w.Fetch(wait); !errors.Is(err, context.DeadlineExceeded) {
			return false, err
		}
		_, err := cons.Info(t.Context())
		return errors.Is(err, jetstream.ErrConsumerNotFound), nil
	}, harness.Within(30*time.Second))
}

// lettersOf is the subjects, each with its count, of job id's dead letters in streams.
func lettersOf(t *testing.T, b bundle, id string, streams ...string) []string {
	t.Helper()
	var letters []string
	for _, name := range streams {
		s, err := b.js.Stream(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(t.Context(), jetstream.WithSubjectFilter(">"))
		if err != nil {
			t.Fatal(err)
		}
		for subject, n := range info.State.Subjects {
			if strings.HasSuffix(subject, "."+id) {
				letters = append(letters, fmt.Sprintf("%s×%d", subject, n))
			}
		}
	}
	return letters
}

// TestSetupDeadLettersNoJobThatEnded: a worker of team-b ended a job, recorded its end in its
// status (succeeded, capped, cancelled: ends a worker acks, with no dead letter) and has not
// acked it yet; setup then retires team-b. It took the job as not running and dead-lettered
// it unknown_tenant: the job ended twice, its run's end and a dead letter. It writes no letter
// for a job whose status says it ended so. Then it removed the message and, with it the
// tenant's last, the consumer: a worker alive between its status and its ack waited for an
// answer to its ack until its attempt's deadline. Such a job its consumer delivered is now
// left to its worker's ack, or, its worker gone, to the sweep, which acks it.
func TestSetupDeadLettersNoJobThatEnded(t *testing.T) {
	t.Parallel()
	for _, state := range []job.State{job.StateSucceeded, job.StateCapped, job.StateCancelled} {
		t.Run(string(state), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := t.Context()
			old, j, d := b.fetchedByOldWorker(t)
			if _, err := old.UpdateStatus(ctx, d.Ref(), func(st *job.Status) { st.State, st.Attempt = state, d.Attempt }, queue.ByAttempt(d.Attempt)); err != nil {
				t.Fatal(err)
			}
			b.declare(t, map[string]config.Tenant{"team-a": {}})
			if dl, err := queue.DeadLetterOf(ctx, b.nc, b.cfg, d.Ref()); !errors.Is(err, jetstream.ErrMsgNotFound) {
				t.Errorf("the %s job's dead letter: %s, %v; want none", state, dl, err)
			}
			// Its worker may be alive, between its status and its ack: the ack is answered.
			ack, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := d.Ack(ack); err != nil {
				t.Errorf("the worker's ack of the %s job after setup: %v; want it answered, the job left to it", state, err)
			}
			b.declare(t, map[string]config.Tenant{"team-a": {}})
			if _, err := b.js.Stream(ctx, queue.JobStream(b.cfg, "team-b")); !errors.Is(err, jetstream.ErrStreamNotFound) {
				t.Errorf("team-b's job stream after the next setup: %v; want it removed", err)
			}
			kv, err := b.js.KeyValue(ctx, queue.StatusBucket(b.cfg, "team-b"))
			if err != nil {
				t.Fatal(err)
			}
			if e, err := kv.Get(ctx, "team-b."+j.ID); err != nil || !strings.Contains(string(e.Value()), `"state":"`+string(state)+`"`) {
				t.Errorf("the job's status after setup: %v; want %s", err, state)
			}
		})
	}
}

// TestSetupLeavesAJobAWorkerHolds: a worker of team-b fetched a job and has not written its
// running status yet (its claim reads the store first), and setup retires team-b. Setup took
// the job as not running, dead-lettered it unknown_tenant and removed it, while the worker went
// on to run it: the job ended twice, its run's end and a dead letter. A job team-b's consumer
// has delivered and whose status says no end is now left, as a running one is: to its run, or,
// its worker gone, to the sweep of a worker of the new config, which ends it once.
func TestSetupLeavesAJobAWorkerHolds(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *config.NATS) { c.AckWait = config.Duration(time.Minute) })
	ctx := t.Context()
	old := b.open(t, b.cfg, map[string]config.Tenant{"team-b": {}}, nil)
	held, queued := newJob(t), newJob(t)
	c := b.client(t, "team-b")
	if _, err := c.Publish(ctx, held); err != nil {
		t.Fatal(err)
	}
	d := fetch(t, old, 10*time.Second)
	if _, err := c.Publish(ctx, queued); err != nil {
		t.Fatal(err)
	}
	b.declare(t, map[string]config.Tenant{"team-a": {}})
	if dl, err := queue.DeadLetterOf(ctx, b.nc, b.cfg, d.Ref()); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("the held job's dead letter: %s, %v; want none, the job left to its worker", dl, err)
	}
	if dl := b.deadLetterOf(t, "team-b", queued.ID); dl.Reason != queue.ReasonUnknownTenant {
		t.Errorf("the job no worker was delivered: %+v; want it dead-lettered %s", dl, queue.ReasonUnknownTenant)
	}
	if st, err := old.Status(ctx, queue.Ref{Tenant: "team-b", ID: queued.ID}); err != nil || st.State != job.StateDead || !strings.HasPrefix(st.Error, queue.ReasonUnknownTenant) {
		t.Errorf("the status of the job no worker was delivered: %+v, %v; want it dead, %s", st, err, queue.ReasonUnknownTenant)
	}
	if _, consumer := b.serves(t, "team-b"); !consumer {
		t.Error("setup removed team-b's consumer, through which the worker acks the held job; want it left")
	}
	if err := d.Ack(ctx); err != nil {
		t.Errorf("the worker's ack of the held job: %v", err)
	}
}

// TestSetupSeesADeliveryBetweenTwoJobs: setup retiring team-b reads, for each job whose status
// records no end, how far team-b's consumer delivered. It read that once for the tenant, at its
// first such job, and used it for the others: a worker of the old config fetching a later job
// meanwhile (its claim not yet past the running status) held a job setup then took as never
// delivered, dead-lettered unknown_tenant and removed, while the worker ran it. Each job's is
// read after its status.
func TestSetupSeesADeliveryBetweenTwoJobs(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *config.NATS) { c.AckWait = config.Duration(time.Minute) })
	ctx := t.Context()
	old := b.open(t, b.cfg, map[string]config.Tenant{"team-b": {}}, nil)
	first, later := newJob(t), newJob(t)
	c := b.client(t, "team-b")
	for _, j := range []job.Job{first, later} {
		if _, err := c.Publish(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	admin, err := queue.NewAdmin(b.nc, b.cfg, map[string]config.Tenant{"team-a": {}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	held, err := admin.HeldUpTo(ctx, "team-b")
	if err != nil {
		t.Fatal(err)
	}
	if upTo, err := held(queue.Ref{Tenant: "team-b", ID: first.ID}); err != nil || upTo != 0 {
		t.Fatalf("delivered up to %d (%v) before any fetch; want 0", upTo, err)
	}
	d := fetch(t, old, 10*time.Second) // the first job published, at sequence 1
	d2 := fetch(t, old, 10*time.Second)
	if upTo, err := held(queue.Ref{Tenant: "team-b", ID: later.ID}); err != nil || upTo < 2 {
		t.Errorf("delivered up to %d (%v) once the worker fetched %s and %s; want 2: setup takes them as never delivered", upTo, err, d.JobID, d2.JobID)
	}
}

// fetchedByOldWorker is a worker of the old config, which serves team-b, and a job of team-b it
// fetched: what setup with a config that drops team-b finds.
func (b bundle) fetchedByOldWorker(t *testing.T) (*queue.Consumer, job.Job, *queue.Delivery) {
	t.Helper()
	old := b.open(t, b.cfg, map[string]config.Tenant{"team-b": {}}, nil)
	j := newJob(t)
	if _, err := b.client(t, "team-b").Publish(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	return old, j, fetch(t, old, 10*time.Second)
}

// TestSetupLeavesAJobClaimedAfterItsRead: setup retiring team-b read a job's status (no end)
// and how far team-b's consumer delivered (not that far), and a worker of the old config
// fetched the job and wrote its running status before setup removed it. Setup dead-lettered it
// unknown_tenant and removed it, while the worker ran it: the job ended twice. Setup now writes
// the job's end with a compare-and-set of the status it read: the claim in between makes that
// write fail, and setup leaves the job to its worker.
func TestSetupLeavesAJobClaimedAfterItsRead(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *config.NATS) { c.AckWait = config.Duration(time.Minute) })
	ctx := t.Context()
	old := b.open(t, b.cfg, map[string]config.Tenant{"team-b": {}}, nil)
	j := newJob(t)
	if _, err := b.client(t, "team-b").Publish(ctx, j); err != nil {
		t.Fatal(err)
	}
	admin, err := queue.NewAdmin(b.nc, b.cfg, map[string]config.Tenant{"team-a": {}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	var d *queue.Delivery
	admin.AfterHeldRead(func(r queue.Ref) {
		if d != nil || r.ID != j.ID {
			return
		}
		d = fetch(t, old, 10*time.Second)
		if _, err := old.UpdateNewStatus(ctx, d.Ref(), func(s *job.Status) { s.State, s.Attempt = job.StateRunning, d.Attempt }); err != nil {
			t.Fatalf("the worker's claim: %v", err)
		}
	})
	if err := admin.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	if d == nil {
		t.Fatal("setup never came to the job")
	}
	if dl, err := queue.DeadLetterOf(ctx, b.nc, b.cfg, d.Ref()); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("the claimed job's dead letter: %s, %v; want none, the job left to its worker", dl, err)
	}
	if st, err := old.Status(ctx, d.Ref()); err != nil || st.State != job.StateRunning {
		t.Errorf("the claimed job's status: %+v, %v; want running, its worker's", st, err)
	}
	if _, consumer := b.serves(t, "team-b"); !consumer {
		t.Error("setup removed team-b's consumer, through which the worker acks the claimed job; want it left")
	}
}
