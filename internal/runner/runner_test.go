package runner_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/test/harness"
)

func TestJobSucceedsAndCommitsItsRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.worker(agentFunc(writeReport))
	j := b.submit("p")
	st := b.waitFinal(j.ID, 10*time.Second)
	if st.State != job.StateSucceeded || st.Attempt != 1 {
		t.Fatalf("status = %+v, want succeeded on attempt 1", st)
	}
	m := b.manifest(j.ID)
	var names []string
	for _, s := range m.Subjects {
		names = append(names, s.Name)
	}
	if got, want := strings.Join(names, ","), "artifacts/table.csv,report.md,transcript.jsonl"; got != want {
		t.Errorf("manifest subjects = %s, want %s", got, want)
	}
	if m.Predicate.Inputs[0].SHA256 != j.Inputs[0].SHA256 || m.Predicate.Outcome.State != job.StateSucceeded {
		t.Errorf("manifest predicate = %+v", m.Predicate)
	}
	waitFor(t, 5*time.Second, "sandbox closed", func() bool { return w.p.open.Load() == 0 })
	waitFor(t, 5*time.Second, "boxcar_jobs_total{succeeded} = 1", func() bool {
		return testutil.ToFloat64(w.m.Jobs.WithLabelValues("p", "succeeded")) == 1
	})
}

func TestPoisonMessagesAreRejectedWithoutASandbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.worker(agentFunc(writeReport))
	ctx := context.Background()
	js, err := jetstream.New(b.nc)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		id     string
		data   string
		reason string
	}{
		{name: "not json", id: "poison-000001", data: "{not json", reason: "invalid_job"},
		{name: "unknown field", id: "poison-000002", data: `{"version":1,"id":"poison-000002","profile":"p","task":"t","submitted_at":"2026-01-01T00:00:00Z","evil":1}`, reason: "invalid_job"},
		{name: "id mismatch", id: "poison-000003", data: `{"version":1,"id":"poison-999999","profile":"p","task":"t","submitted_at":"2026-01-01T00:00:00Z"}`, reason: "invalid_job"},
		{name: "unknown profile", id: "poison-000004", data: `{"version":1,"id":"poison-000004","profile":"nope","task":"t","submitted_at":"2026-01-01T00:00:00Z"}`, reason: "unknown_profile"},
		// What encoding/json lets through and another reader of the bytes would read otherwise.
		{name: "id given twice", id: "poison-000005", data: `{"version":1,"id":"poison-other","id":"poison-000005","profile":"p","task":"t","submitted_at":"2026-01-01T00:00:00Z"}`, reason: "invalid_job"},
		{name: "key in capitals", id: "poison-000006", data: `{"version":1,"ID":"poison-000006","profile":"p","task":"t","submitted_at":"2026-01-01T00:00:00Z"}`, reason: "invalid_job"},
		{name: "not UTF-8", id: "poison-000007", data: "{\"version\":1,\"id\":\"poison-000007\",\"profile\":\"p\",\"task\":\"caf\xe9\",\"submitted_at\":\"2026-01-01T00:00:00Z\"}", reason: "invalid_job"},
		{name: "over 64 KiB", id: "poison-000008", data: `{"version":1,"id":"poison-000008","profile":"p","task":"` + strings.Repeat("x", job.MaxMessageBytes) + `","submitted_at":"2026-01-01T00:00:00Z"}`, reason: "invalid_job"},
		// No run can start in it: it was retried as the store's "context deadline exceeded"
		// until it was dead.
		{name: "job_timeout of a nanosecond", id: "poison-000010", data: `{"version":1,"id":"poison-000010","profile":"p","task":"t","submitted_at":"2026-01-01T00:00:00Z","limits":{"job_timeout":"1ns"}}`, reason: "invalid_job"},
		{name: "deeply nested", id: "poison-000009", data: `{"version":1,"id":"poison-000009","profile":"p","task":"t","submitted_at":"2026-01-01T00:00:00Z","labels":{"a":` + strings.Repeat("[", 20000) + `}}`, reason: "invalid_job"},
	}
	for _, tt := range tests {
		if _, err := js.Publish(ctx, b.cfg.NATS.Subject+".default."+tt.id, []byte(tt.data)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "dead letters", func() bool { return len(b.deadLetters()) == len(tests) })
	got := map[string]queue.DeadLetter{}
	for _, dl := range b.deadLetters() {
		got[dl.JobID] = dl
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dl := got[tt.id]
			if dl.Reason != tt.reason || dl.Attempt != 1 || string(dl.Original) != tt.data {
				t.Errorf("dead letter = %+v, want reason %s on attempt 1 with the payload", dl, tt.reason)
			}
			st, err := b.q.Status(ctx, tt.id)
			if err != nil || st.State != job.StateRejected || st.Error == "" {
				t.Errorf("status = %+v, %v; want rejected with the reason", st, err)
			}
		})
	}
	if n := w.p.started.Load(); n != 0 {
		t.Errorf("%d sandboxes started for poison messages, want 0", n)
	}
	// The worker keeps running.
	j := b.submit("p")
	if st := b.waitFinal(j.ID, 10*time.Second); st.State != job.StateSucceeded {
		t.Errorf("job after poison = %+v", st)
	}
}

func TestTransientFailuresEndInTheDeadLetterStreamAfterMaxDeliver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var (
		mu    sync.Mutex
		times []time.Time
	)
	failing := agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		return agent.Result{}, fmt.Errorf("%w: 503 from the model", agent.ErrModelUnavailable)
	})
	b.worker(failing)
	j := b.submit("p")
	st := b.waitFinal(j.ID, 20*time.Second)
	if st.State != job.StateDead || st.Attempt != b.cfg.NATS.MaxDeliver {
		t.Fatalf("status = %+v, want dead after %d attempts", st, b.cfg.NATS.MaxDeliver)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(times) != b.cfg.NATS.MaxDeliver {
		t.Fatalf("agent ran %d times, want exactly %d", len(times), b.cfg.NATS.MaxDeliver)
	}
	base := time.Duration(b.cfg.NATS.RetryBackoff)
	for i := 1; i < len(times); i++ {
		if gap, want := times[i].Sub(times[i-1]), base<<(i-1); gap < want {
			t.Errorf("attempt %d came %s after the previous one, want at least %s of backoff", i+1, gap, want)
		}
	}
	// The status is recorded before the message is terminated and dead-lettered.
	waitFor(t, 5*time.Second, "the dead letter", func() bool { return len(b.deadLetters()) > 0 })
	dls := b.deadLetters()
	if len(dls) != 1 || dls[0].JobID != j.ID || dls[0].Attempt != b.cfg.NATS.MaxDeliver || !strings.Contains(dls[0].Error, "503") {
		t.Errorf("dead letters = %+v, want one for %s with the last error", dls, j.ID)
	}
}

// TestAgentPanicFailsItsJobAndTheWorkerGoesOn: a panic in the agent (a nil answer it did not
// expect, say) ends that job failed with the reason agent_panicked, once, and logs the stack
// with the job and tenant; the worker lives on and runs the next job.
func TestAgentPanicFailsItsJobAndTheWorkerGoesOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var logs harness.LogBuffer
	var panics atomic.Int64
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		if req.Task == "panic" {
			panics.Add(1)
			panic("the agent read a nil answer")
		}
		return writeReport(ctx, req)
	}), func(c *runner.Config) { c.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) })
	bad := b.submitTask("p", "panic")
	st := b.waitFinal(bad.ID, 10*time.Second)
	if st.State != job.StateFailed || !strings.Contains(st.Error, "panicked") {
		t.Fatalf("status = %+v, want failed saying the agent panicked", st)
	}
	if out := b.manifest(bad.ID).Predicate.Outcome; out.Reason != "agent_panicked" {
		t.Errorf("manifest outcome = %+v, want the reason agent_panicked", out)
	}
	if n := panics.Load(); n != 1 {
		t.Errorf("the agent ran the job %d times, want once: a panic is not retried", n)
	}
	const msg = "the agent panicked; the job fails and the worker goes on"
	for key, want := range map[string]string{"job_id": bad.ID, "tenant": "default", "stack": "runAgent"} {
		if got, _ := logs.Record(msg, key); !strings.Contains(got, want) {
			t.Errorf("log %q: %s = %.200q, want it to hold %q\n%s", msg, key, got, want, logs.String())
		}
	}
	good := b.submit("p")
	if st := b.waitFinal(good.ID, 10*time.Second); st.State != job.StateSucceeded {
		t.Errorf("the next job's status = %+v, want succeeded by the same worker", st)
	}
}

func TestKilledWorkerJobIsRedeliveredAndCompletesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j, dying := b.killedMidRun(nil)

	w := b.worker(agentFunc(writeReport))
	st := b.waitFinal(j.ID, 20*time.Second)
	if st.State != job.StateSucceeded || st.Attempt != 2 {
		t.Fatalf("status = %+v, want succeeded on attempt 2", st)
	}
	keys, err := b.store.List(context.Background(), store.RunPrefix(j.ID))
	if err != nil {
		t.Fatal(err)
	}
	manifests := 0
	for _, k := range keys {
		if path.Base(k.Key) == "manifest.json" {
			manifests++
		}
	}
	if manifests != 1 {
		t.Errorf("%d manifests, want exactly 1", manifests)
	}
	waitFor(t, 5*time.Second, "second worker counts one job", func() bool {
		return testutil.ToFloat64(w.m.Jobs.WithLabelValues("p", "succeeded")) == 1
	})
	if dying.p.open.Load() != 0 {
		t.Errorf("the killed worker left %d sandboxes open", dying.p.open.Load())
	}
}

func TestRacingAttemptsCommitOneManifest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	var firstRuns atomic.Int64
	slow := agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		firstRuns.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
			return agent.Result{}, ctx.Err()
		}
		if err := req.Sandbox.WriteFile(ctx, "report.md", []byte("stale report")); err != nil {
			return agent.Result{}, err
		}
		return agent.Result{Outcome: agent.OutcomeCompleted}, nil
	})
	// No heartbeats: the first worker's ack deadline passes while it is still working.
	var stalePuts atomic.Int64
	counted := &hookStore{Store: b.shared, put: func(string) error { stalePuts.Add(1); return nil }}
	stale := b.worker(slow, func(c *runner.Config) {
		c.HeartbeatInterval, c.Worker.Concurrency, c.Store = time.Hour, 1, counted
	})
	j := b.submit("p")
	waitFor(t, 5*time.Second, "first attempt running", func() bool { return firstRuns.Load() == 1 })
	winner := b.worker(agentFunc(writeReport))
	st := b.waitFinal(j.ID, 20*time.Second)
	if st.State != job.StateSucceeded || st.Attempt != 2 {
		t.Fatalf("status = %+v, want succeeded on attempt 2", st)
	}
	close(release)
	waitFor(t, 10*time.Second, "stale attempt recorded", func() bool {
		return testutil.ToFloat64(stale.m.StaleAttempts) == 1
	})
	if report := b.runFile(j.ID, "report.md"); strings.Contains(string(report), "stale") {
		t.Errorf("the stale attempt overwrote the committed report: %q", report)
	}
	// It ran past its ack wait, so it asked before uploading, and found the job taken.
	if n := stalePuts.Load(); n != 0 {
		t.Errorf("the stale attempt stored %d objects, want none: it lost its lease before the upload", n)
	}
	if m := b.manifest(j.ID); m.Predicate.Attempt != 2 {
		t.Errorf("manifest attempt = %d, want the winner's 2", m.Predicate.Attempt)
	}
	waitFor(t, 5*time.Second, "winner counts one job", func() bool {
		return testutil.ToFloat64(winner.m.Jobs.WithLabelValues("p", "succeeded")) == 1
	})
}

func TestNATSRestartDuringARunLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proceed := make(chan struct{})
	started := make(chan struct{}, 1)
	a := agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		started <- struct{}{}
		<-proceed
		return writeReport(ctx, req)
	})
	b.worker(a)
	j := b.submit("p")
	<-started
	port := b.srv.Addr().(*net.TCPAddr).Port
	b.srv.Shutdown()
	b.srv.WaitForShutdown()
	b.start(port)
	close(proceed)
	st := b.waitFinal(j.ID, 30*time.Second)
	if st.State != job.StateSucceeded {
		t.Fatalf("status after restart = %+v, want succeeded", st)
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	started := make(chan struct{}, 1)
	a := agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		if err := req.Sandbox.WriteFile(ctx, "report.md", []byte("partial")); err != nil {
			return agent.Result{}, err
		}
		started <- struct{}{}
		<-ctx.Done()
		return agent.Result{}, ctx.Err()
	})

	t.Run("queued job never starts", func(t *testing.T) {
		j := b.submit("p")
		if _, err := b.q.Cancel(ctx, j.ID, "tester"); err != nil {
			t.Fatal(err)
		}
		w := b.worker(a)
		waitFor(t, 10*time.Second, "message consumed", b.consumed)
		if n := w.p.started.Load(); n != 0 {
			t.Errorf("a cancelled job started %d sandboxes", n)
		}
		if st, _ := b.q.Status(ctx, j.ID); st.State != job.StateCancelled {
			t.Errorf("state = %s, want cancelled", st.State)
		}
		w.stop()
	})

	t.Run("running job stops within seconds", func(t *testing.T) {
		w := b.worker(a)
		j := b.submit("p")
		<-started
		asked := time.Now()
		if _, err := b.q.Cancel(ctx, j.ID, "tester"); err != nil {
			t.Fatal(err)
		}
		st := b.waitFinal(j.ID, 10*time.Second)
		if st.State != job.StateCancelled {
			t.Fatalf("state = %s, want cancelled", st.State)
		}
		if d := time.Since(asked); d > 5*time.Second {
			t.Errorf("took %s to stop", d)
		}
		waitFor(t, 5*time.Second, "sandbox removed", func() bool { return w.p.open.Load() == 0 })
		if m := b.manifest(j.ID); m.Predicate.Outcome.State != job.StateCancelled {
			t.Errorf("manifest outcome = %s, want cancelled", m.Predicate.Outcome.State)
		}
	})
}

func TestShutdownInterruptsAndHandsTheJobBackAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.setAckWait(30 * time.Second) // redelivery must not wait for this
	started := make(chan struct{}, 1)
	hang := agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		started <- struct{}{}
		<-ctx.Done()
		return agent.Result{}, ctx.Err()
	})
	first := b.worker(hang)
	j := b.submit("p")
	<-started
	first.stop() // drain_grace is 1s, then the job is interrupted
	if st, _ := b.q.Status(context.Background(), j.ID); st.State != job.StateInterrupted {
		t.Errorf("state after shutdown = %s, want interrupted", st.State)
	}
	if first.p.open.Load() != 0 {
		t.Errorf("shutdown left %d sandboxes open", first.p.open.Load())
	}
	start := time.Now()
	b.worker(agentFunc(writeReport))
	st := b.waitFinal(j.ID, 10*time.Second)
	if st.State != job.StateSucceeded || st.Attempt != 2 {
		t.Fatalf("status = %+v, want succeeded on attempt 2", st)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("redelivery took %s; an interrupted job must be handed back at once", d)
	}
}

// TestShutdownMidUploadInterruptsTheJob: the drain grace runs out while a finished run is
// uploaded. The upload's failure is the shutdown's doing, which its cause says when the failure
// is seen: the job is interrupted and handed back at once, not a transient fault retried after
// the backoff (or, on its last delivery, dead), and the next delivery runs it.
func TestShutdownMidUploadInterruptsTheJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stalling := &stallingStore{Store: b.shared, stalled: make(chan struct{})}
	first := b.worker(agentFunc(writeReport), func(c *runner.Config) { c.Store = stalling })
	j := b.submit("p")
	<-stalling.stalled
	first.stop() // drain_grace is 1s, then the upload is cut short
	if st, _ := b.q.Status(context.Background(), j.ID); st.State != job.StateInterrupted || st.Attempt != 1 {
		t.Errorf("status after a shutdown mid-upload = %s, attempt %d, error %q; want interrupted, attempt 1", st.State, st.Attempt, st.Error)
	}
	b.worker(agentFunc(writeReport))
	if st := b.waitFinal(j.ID, 20*time.Second); st.State != job.StateSucceeded || st.Attempt != 2 {
		t.Errorf("status = %+v, want succeeded on attempt 2", st)
	}
}

// stallingStore holds every write into an attempt's folder until its context ends, as a store
// that stops answering in the middle of an upload does.
type stallingStore struct {
	store.Store
	once    sync.Once
	stalled chan struct{} // closed at the first write held
}

func (s *stallingStore) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	if !strings.Contains(key, "/attempts/") {
		return s.Store.PutIfAbsent(ctx, key, r, size)
	}
	s.once.Do(func() { close(s.stalled) })
	<-ctx.Done()
	return fmt.Errorf("store: put-if-absent %s: %w", key, ctx.Err())
}

// sigFailStore loses the first upload of the run's signature (not the copy the attempt leaves
// in its folder), as a store fault or a crash between the manifest and its signature would.
type sigFailStore struct {
	store.Store
	failed atomic.Bool
}

func (s *sigFailStore) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	if path.Base(key) == "manifest.dsse.json" && !strings.Contains(key, "/attempts/") && !s.failed.Swap(true) {
		return errors.New("store: connection reset")
	}
	return s.Store.PutIfAbsent(ctx, key, r, size)
}

// A job whose work is done gives its slot to the next one while its status and ack are on their
// way, and no more jobs settle at once than the worker has slots: one job held in its settling
// lets a second run and commit, and a third waits for the first.
func TestSettlingFreesTheSlotForTheNextJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, second, third := b.submit("p"), b.submit("p"), b.submit("p")
	held := &holdFinalStatus{id: first.ID, held: make(chan struct{}), release: make(chan struct{})}
	b.worker(agentFunc(writeReport), func(c *runner.Config) {
		held.Queue, c.Queue, c.Worker.Concurrency = c.Queue, held, 1
	})
	release := sync.OnceFunc(func() { close(held.release) })
	t.Cleanup(release) // runs before the worker's stop, which waits for the held job
	<-held.held
	waitFor(t, 20*time.Second, "the second job committed while the first settles", func() bool {
		_, err := b.store.Stat(context.Background(), store.ManifestKey(second.ID))
		return err == nil
	})
	time.Sleep(200 * time.Millisecond) // room for a third fetch the bound must refuse
	if st, err := b.q.Status(context.Background(), third.ID); err != nil || st.State != job.StateQueued {
		t.Errorf("third job while two settle on a one-slot worker: %+v, %v; want it queued", st, err)
	}
	release()
	for _, j := range []job.Job{first, second, third} {
		if st := b.waitFinal(j.ID, 20*time.Second); st.State != job.StateSucceeded {
			t.Errorf("job %s = %+v, want succeeded", j.ID, st)
		}
	}
	waitFor(t, 10*time.Second, "every job acknowledged", b.consumed)
}

// holdFinalStatus holds the write of one job's final status until released.
type holdFinalStatus struct {
	runner.Queue
	id            string
	once          sync.Once
	held, release chan struct{}
}

func (q *holdFinalStatus) UpdateStatus(ctx context.Context, ref queue.Ref, change func(*job.Status), conds ...queue.StatusCond) (job.Status, error) {
	var probe job.Status
	if change(&probe); ref.ID == q.id && probe.State.Terminal() {
		q.once.Do(func() { close(q.held) })
		<-q.release
	}
	return q.Queue.UpdateStatus(ctx, ref, change, conds...)
}

// TestRedeliveryOfAnUnsignedCommittedRunRestoresItsSignature: a run committed without its
// signature gets the envelope its attempt left before committing, the same bytes.
func TestRedeliveryOfAnUnsignedCommittedRunRestoresItsSignature(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	priv, pub := signingKeys(t)
	var ran atomic.Int64
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		ran.Add(1)
		return writeReport(ctx, req)
	}), func(c *runner.Config) {
		c.SigningKey = priv
		c.Store = &sigFailStore{Store: b.shared}
	})
	j := b.submit("p")
	st := b.waitFinal(j.ID, 15*time.Second)
	if st.State != job.StateSucceeded {
		t.Fatalf("status = %+v, want succeeded", st)
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("the job ran %d times, want once: the redelivery only signs", n)
	}
	report, err := provenance.Verify(ctx, b.store, j.ID, pub)
	if err != nil || !report.OK() {
		t.Fatalf("verify: %v %+v", err, report.Checks)
	}
	left := b.object(provenance.AttemptSignatureKey(j.ID, report.Statement))
	if got := b.object(store.SignatureKey(j.ID)); !bytes.Equal(got, left) {
		t.Errorf("the run's envelope is not the one its attempt left:\n%s\n%s", got, left)
	}
}

// TestCommittedManifestNoWorkerBuiltIsNeverSigned: a manifest someone who can write to the store
// put in a job's folder before it ran makes the worker end the job as it says, but the worker
// signs nothing: the run stays unsigned, whether the planted attempt folder holds no envelope
// or one of another key, so the worker's key vouches for nothing it did not build.
func TestCommittedManifestNoWorkerBuiltIsNeverSigned(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		envelope func(t *testing.T, manifest []byte) []byte // what the planted attempt folder holds; nil for nothing
		warns    bool                                       // that the run stays unsigned
	}{
		{"no envelope", func(*testing.T, []byte) []byte { return nil }, true},
		{"envelope of another key", func(t *testing.T, manifest []byte) []byte {
			other, _ := signingKeys(t)
			env, err := provenance.Sign(context.Background(), manifest, other)
			if err != nil {
				t.Fatal(err)
			}
			return env
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			priv, pub := signingKeys(t)
			j := b.submit("p")
			const folder = "1-planted0"
			report := []byte("# planted\n")
			sum := sha256.Sum256(report)
			planted, err := provenance.Build(provenance.Manifest{
				Job:     provenance.Job{ID: j.ID, Profile: "p", Task: "planted"},
				Outcome: provenance.Outcome{State: job.StateSucceeded},
			}, []provenance.Subject{{Name: "report.md", Path: "attempts/" + folder + "/report.md", SHA256: hex.EncodeToString(sum[:]), Size: int64(len(report))}})
			if err != nil {
				t.Fatal(err)
			}
			put := func(key string, data []byte) {
				if err := b.store.PutIfAbsent(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
					t.Fatal(err)
				}
			}
			put(store.AttemptPrefix(j.ID, folder)+"report.md", report)
			if env := tt.envelope(t, planted); env != nil {
				put(store.AttemptSignatureKey(j.ID, folder), env)
			}
			put(store.ManifestKey(j.ID), planted)

			var ran atomic.Int64
			var logs harness.LogBuffer
			b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
				ran.Add(1)
				return writeReport(ctx, req)
			}), func(c *runner.Config) {
				c.SigningKey = priv
				c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
			})
			b.waitFinal(j.ID, 15*time.Second)
			if warned := strings.Contains(logs.String(), "the run stays unsigned"); warned != tt.warns {
				t.Errorf("the worker warned that the run stays unsigned: %v, want %v\n%s", warned, tt.warns, logs.String())
			}
			if n := ran.Load(); n != 0 {
				t.Errorf("the job ran %d times; a committed run is never run again", n)
			}
			if got, err := provenance.Verify(ctx, b.store, j.ID, pub); err == nil && got.OK() {
				t.Errorf("the planted manifest verifies with the worker's key: %+v", got.Checks)
			}
			objects, err := b.store.List(ctx, store.RunPrefix(j.ID))
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range objects {
				if path.Base(o.Key) != "manifest.dsse.json" {
					continue
				}
				if _, err := provenance.VerifyEnvelope(ctx, b.object(o.Key), pub); err == nil {
					t.Errorf("%s is signed with the worker's key", o.Key)
				}
			}
		})
	}
}

// TestOversizeReportFailsButKeepsTheRun: a report over the limit is not uploaded, and the run
// is still committed without it, transcript and artifacts included, so a user can see what
// happened. A run that would have succeeded or been capped fails with report_too_large, at
// once; one that failed for another reason first keeps that reason.
func TestOversizeReportFailsButKeepsTheRun(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		end        func(res agent.Result) (agent.Result, error) // how the agent ends, after writing
		wantReason string
		wantError  string
	}{
		{
			name:       "completed",
			end:        func(res agent.Result) (agent.Result, error) { return res, nil },
			wantReason: "report_too_large", wantError: "larger than",
		},
		{
			name: "capped",
			end: func(res agent.Result) (agent.Result, error) {
				res.Outcome, res.Cap = agent.OutcomeCapped, agent.CapMaxToolCalls
				return res, nil
			},
			wantReason: "report_too_large", wantError: "larger than",
		},
		{
			name: "failed first",
			end: func(res agent.Result) (agent.Result, error) {
				res.Outcome = ""
				return res, fmt.Errorf("%w: 401 invalid key", agent.ErrModelAuth)
			},
			wantReason: "model_rejected", wantError: "401 invalid key",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := setup(t)
			ctx := context.Background()
			var ran atomic.Int64
			b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
				ran.Add(1)
				if err := req.Sandbox.WriteFile(ctx, "report.md", make([]byte, 5<<20)); err != nil {
					return agent.Result{}, err
				}
				if err := req.Sandbox.WriteFile(ctx, "artifacts/table.csv", []byte("a,b\n1,2\n")); err != nil {
					return agent.Result{}, err
				}
				return tt.end(agent.Result{Outcome: agent.OutcomeCompleted})
			}))
			j := b.submit("p")
			st := b.waitFinal(j.ID, 10*time.Second)
			if st.State != job.StateFailed || !strings.Contains(st.Error, tt.wantError) {
				t.Fatalf("status = %+v, want failed saying %q", st, tt.wantError)
			}
			// Committed: a manifest to read, no report to point at.
			if st.Manifest != b.store.URL(store.ManifestKey(j.ID)) || st.Report != "" {
				t.Errorf("status manifest %q, report %q; want the manifest's URL and no report", st.Manifest, st.Report)
			}
			if n := ran.Load(); n != 1 {
				t.Errorf("the job ran %d times, want once: a report that is too large does not get smaller", n)
			}
			m := b.manifest(j.ID)
			var names []string
			for _, s := range m.Subjects {
				names = append(names, s.Name)
			}
			if got, want := strings.Join(names, ","), "artifacts/table.csv,transcript.jsonl"; got != want {
				t.Errorf("manifest subjects = %s, want %s (no report)", got, want)
			}
			out := m.Predicate.Outcome
			if out.State != job.StateFailed || out.Reason != tt.wantReason || !strings.Contains(out.Error, tt.wantError) {
				t.Errorf("manifest outcome = %+v, want failed with reason %s", out, tt.wantReason)
			}
			if keys, err := b.store.List(ctx, store.RunPrefix(j.ID)); err != nil || slices.ContainsFunc(keys, func(k store.ObjectInfo) bool { return path.Base(k.Key) == "report.md" }) {
				t.Errorf("run objects %+v, %v; want no report", keys, err)
			}
			if report, err := provenance.Verify(ctx, b.store, j.ID, nil); err != nil || !report.OK() {
				t.Errorf("verify: %v %+v", err, report.Checks)
			}
			waitFor(t, 5*time.Second, "the dead letter", func() bool { return len(b.deadLetters()) > 0 })
			if dls := b.deadLetters(); len(dls) != 1 || dls[0].Reason != tt.wantReason {
				t.Errorf("dead letters = %+v, want one with reason %s", dls, tt.wantReason)
			}
		})
	}
}
