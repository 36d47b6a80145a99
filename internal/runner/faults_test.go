package runner_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/store"
	testharness "github.com/boxcar-run/boxcar/test/harness"
)

// hookStore stands in for crashes and outages at exact points of a run: each hook, when set,
// runs before (or after) the store call it names, and an error it returns is the call's.
type hookStore struct {
	store.Store
	mu          sync.Mutex
	stat        func(key string) error
	put         func(key string) error // Put and PutIfAbsent, before the write
	afterCreate func(key string)       // after a PutIfAbsent that wrote
}

func (s *hookStore) hook(f func(string) error, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f == nil {
		return nil
	}
	return f(key)
}

func (s *hookStore) Stat(ctx context.Context, key string) (store.ObjectInfo, error) {
	if err := s.hook(s.stat, key); err != nil {
		return store.ObjectInfo{}, err
	}
	return s.Store.Stat(ctx, key)
}

func (s *hookStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := s.hook(s.put, key); err != nil {
		return err
	}
	return s.Store.Put(ctx, key, r, size)
}

func (s *hookStore) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := s.hook(s.put, key); err != nil {
		return err
	}
	if err := s.Store.PutIfAbsent(ctx, key, r, size); err != nil {
		return err
	}
	s.mu.Lock()
	after := s.afterCreate
	s.mu.Unlock()
	if after != nil {
		after(key)
	}
	return nil
}

var errStoreDown = errors.New("store: dial tcp 127.0.0.1:9: connect: connection refused")

// TestStatusAfterAdoptionIsTheCommittedRuns (issue 10 item 2): a worker dies after committing
// and before settling; the next delivery fails at once (the store is down); the one after
// adopts the committed run. The final status names the attempt, worker and times of the
// manifest, not those of the deliveries that did no work.
func TestStatusAfterAdoptionIsTheCommittedRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var first atomic.Pointer[worker] // set before the job is published, read by the worker's hook
	committed := make(chan struct{})
	dies := &hookStore{Store: b.shared, afterCreate: func(key string) {
		if path.Base(key) == "manifest.json" {
			first.Load().nc.Close() // killed between the commit and the ack
			close(committed)
		}
	}}
	first.Store(b.worker(agentFunc(writeReport), func(c *runner.Config) {
		c.Store, c.Worker.WorkerID = dies, "worker-a"
	}))
	j := b.submit("p")
	<-committed

	var once sync.Once
	down := &hookStore{Store: b.shared}
	down.stat = func(key string) error {
		err := error(nil)
		once.Do(func() { err = errStoreDown }) // the store is down for the first look only
		return err
	}
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		t.Errorf("the committed job ran again")
		return writeReport(ctx, req)
	}), func(c *runner.Config) { c.Store, c.Worker.WorkerID = down, "worker-b" })

	st := b.waitFinal(j.ID, 30*time.Second)
	m := b.manifest(j.ID).Predicate
	if st.State != job.StateSucceeded || st.Attempt != m.Attempt || st.Worker != m.Worker.ID || m.Worker.ID != "worker-a" {
		t.Errorf("status: %s, attempt %d by %q; manifest: attempt %d by %q; want the status to name the manifest's",
			st.State, st.Attempt, st.Worker, m.Attempt, m.Worker.ID)
	}
	if !st.StartedAt.Equal(m.Timings.StartedAt) || !st.FinishedAt.Equal(m.Timings.FinishedAt) {
		t.Errorf("status started %s, finished %s; manifest %s, %s", st.StartedAt, st.FinishedAt, m.Timings.StartedAt, m.Timings.FinishedAt)
	}
	if st.Manifest != b.store.URL(store.ManifestKey(j.ID)) || st.Report == "" {
		t.Errorf("status points at manifest %q, report %q", st.Manifest, st.Report)
	}
}

// TestRejectedWithoutAUsableSubjectIDStillHasAStatus (issue 12): a message published on a
// subject whose job id is not one (uppercase) is rejected and still gets a status, under its
// stream sequence (stream-seq-N, which the publisher's ack reports), so `submit status`
// explains why; not under the id in its JSON, which may be another job's, and a Nats-Msg-Id
// header names nothing.
func TestRejectedWithoutAUsableSubjectIDStillHasAStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(agentFunc(writeReport))
	ctx := context.Background()
	js, err := jetstream.New(b.nc)
	if err != nil {
		t.Fatal(err)
	}
	body := func(id string) []byte {
		return []byte(`{"version":1,"id":"` + id + `","profile":"p","task":"t","submitted_at":"2026-01-01T00:00:00Z"}`)
	}
	ack, err := js.Publish(ctx, b.cfg.NATS.Subject+".default.UPPER-000002", body("upper-000002"), jetstream.WithMsgID("upper-000002"))
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("stream-seq-%d", ack.Sequence)
	waitFor(t, 10*time.Second, "a status for "+id, func() bool {
		st, err := b.q.Status(ctx, id)
		return err == nil && st.State == job.StateRejected && strings.Contains(st.Error, "UPPER-000002") && strings.Contains(st.Error, "upper-000002")
	})
	if st, err := b.q.Status(ctx, "upper-000002"); !errors.Is(err, queue.ErrUnknownJob) {
		t.Errorf("the id the rejected message's JSON names has status %+v, %v; want none", st, err)
	}
}

// TestCommitWaitsForTheStoreMidUpload: the store stops taking writes in the middle of the
// upload. The attempt keeps its delivery and commits once the store takes them again, on its
// first and only delivery, and what the failed tries wrote is removed: the run holds only what
// its manifest names.
func TestCommitWaitsForTheStoreMidUpload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	oneDelivery(b)
	var mu sync.Mutex
	refused := 0
	down := &hookStore{Store: b.shared, put: func(key string) error {
		mu.Lock()
		defer mu.Unlock()
		if strings.HasSuffix(key, "/"+"transcript.jsonl") && refused < 3 {
			refused++
			return errors.New("store: put-if-absent " + key + ": connect: connection refused")
		}
		return nil
	}}
	b.worker(agentFunc(writeReport), func(c *runner.Config) { c.Store = down })
	j := b.submit("p")
	waitFor(t, 30*time.Second, "the status to say what the attempt waits for", func() bool {
		st, err := b.q.Status(context.Background(), j.ID)
		return err == nil && st.State == job.StateRunning && strings.HasPrefix(st.Error, "waiting for the store: ")
	})
	b.checkEnd(j.ID, job.StateSucceeded, 0)
	if st := b.waitFinal(j.ID, 30*time.Second); st.Attempt != 1 {
		t.Errorf("succeeded on attempt %d, want 1: the delivery was kept", st.Attempt)
	}
	report, err := provenance.Verify(context.Background(), b.store, j.ID, nil)
	if err != nil || !report.OK() {
		t.Fatalf("verify: %v %+v", err, report.Checks)
	}
	if unlisted, err := provenance.Unlisted(context.Background(), b.store, j.ID, report.Statement); err != nil || len(unlisted) != 0 {
		t.Errorf("objects the manifest does not name: %q, %v; want none: the failed tries' are removed", unlisted, err)
	}
}

// TestStaleAttemptPausedMidUploadLeavesTheCommittedRunAlone (issue 10 item 7): a worker paused
// in the middle of its upload past the ack deadline (a GC stall, a frozen VM, SIGSTOP) resumes
// after the next attempt committed. What it writes then must not change any object the
// committed manifest names: the run still verifies and keeps the winner's report.
func TestStaleAttemptPausedMidUploadLeavesTheCommittedRunAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	j := b.newJob("p", "t")
	committed := func() bool {
		_, err := b.store.Stat(ctx, store.ManifestKey(j.ID))
		return err == nil
	}
	var paused sync.Once
	pausing := &hookStore{Store: b.shared}
	pausing.put = func(key string) error {
		// The first upload of the stale attempt stops here until the other attempt committed.
		paused.Do(func() { waitFor(t, 30*time.Second, "the next attempt's commit", committed) })
		return nil
	}
	staleReport := agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		if err := req.Sandbox.WriteFile(ctx, "report.md", []byte("stale report\n")); err != nil {
			return agent.Result{}, err
		}
		return agent.Result{Outcome: agent.OutcomeCompleted}, nil
	})
	// No heartbeats: the paused worker's ack deadline passes while it waits in the upload.
	stale := b.worker(staleReport, func(c *runner.Config) {
		c.Store, c.HeartbeatInterval, c.Worker.Concurrency = pausing, time.Hour, 1
	})
	b.publish(j)
	waitFor(t, 10*time.Second, "the first attempt's upload", func() bool {
		st, err := b.q.Status(ctx, j.ID)
		return err == nil && st.Progress == "uploading"
	})
	b.worker(agentFunc(writeReport))
	st := b.waitFinal(j.ID, 30*time.Second)
	if st.State != job.StateSucceeded || st.Attempt != 2 {
		t.Fatalf("status = %+v, want succeeded on attempt 2", st)
	}
	waitFor(t, 30*time.Second, "the stale attempt to end", func() bool {
		return testutil.ToFloat64(stale.m.StaleAttempts) == 1
	})

	report, err := provenance.Verify(ctx, b.store, j.ID, nil)
	if err != nil {
		t.Errorf("the committed run no longer verifies after the stale attempt resumed: %v", err)
	}
	for _, s := range report.Statement.Subjects {
		rc, err := b.store.Get(ctx, provenance.SubjectKey(j.ID, s))
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(rc)
		rc.Close()
		if strings.Contains(string(data), "stale") {
			t.Errorf("%s of the committed run holds the stale attempt's content: %q", s.Name, data)
		}
	}
	if m := report.Statement.Predicate; m.Attempt != 2 {
		t.Errorf("manifest attempt = %d, want the winner's 2", m.Attempt)
	}
	// The stale attempt removed what it wrote: only the committed attempt's folder is left.
	unlisted, err := provenance.Unlisted(ctx, b.store, j.ID, report.Statement)
	if err != nil || len(unlisted) != 0 {
		t.Errorf("objects the manifest does not name: %q, %v; want none", unlisted, err)
	}
}

// TestUnawareStaleAttemptCommitsFirst: an attempt that lost its lease without its clock telling
// it so (here its heartbeats stop, as on a suspended machine, and the consumer's ack wait
// shortened on the server after the worker read it) does not look before it commits, and commits first while the
// next attempt runs. That is the job's run: the next attempt's commit is refused, it removes what
// it wrote, and the job ends once, on the first attempt's report, with nothing left to deliver.
func TestUnawareStaleAttemptCommitsFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.setAckWait(time.Hour) // what the first worker reads when it starts: its lease is not at risk for 30 minutes
	j := b.newJob("p", "t")
	status := func() job.Status {
		st, _ := b.q.Status(ctx, j.ID)
		return st
	}
	stale := b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		waitFor(t, 30*time.Second, "the next attempt to start", func() bool { return status().Attempt >= 2 })
		if err := req.Sandbox.WriteFile(ctx, "report.md", []byte("first attempt's report\n")); err != nil {
			return agent.Result{}, err
		}
		return agent.Result{Outcome: agent.OutcomeCompleted}, nil
	}), func(c *runner.Config) {
		c.Worker.Concurrency = 1
		c.HeartbeatInterval = 20 * time.Minute // suspended: no heartbeat reaches the server
	})
	b.publish(j)
	waitFor(t, 10*time.Second, "the first attempt to run", func() bool { return status().Attempt == 1 })
	// The server now delivers the job again after 2 s; the next worker reads that when it
	// starts and keeps its attempt alive.
	b.setAckWait(2 * time.Second)
	next := b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		waitFor(t, 30*time.Second, "the first attempt's commit", func() bool {
			_, err := b.store.Stat(ctx, store.ManifestKey(j.ID))
			return err == nil
		})
		return writeReport(ctx, req)
	}))
	waitFor(t, 30*time.Second, "the next attempt to end", func() bool {
		return testutil.ToFloat64(next.m.StaleAttempts) == 1
	})
	if st := b.waitFinal(j.ID, 30*time.Second); st.State != job.StateSucceeded || st.Attempt != 1 {
		t.Fatalf("status = %+v, want succeeded on attempt 1", st)
	}
	if n := testutil.ToFloat64(stale.m.StaleAttempts); n != 0 {
		t.Errorf("the first attempt counted %v stale attempts, want 0: it committed", n)
	}
	report, err := provenance.Verify(ctx, b.store, j.ID, nil)
	if err != nil || !report.OK() {
		t.Fatalf("verify: %v %+v", err, report.Checks)
	}
	if m := report.Statement.Predicate; m.Attempt != 1 {
		t.Errorf("manifest attempt = %d, want the first attempt's", m.Attempt)
	}
	if unlisted, err := provenance.Unlisted(ctx, b.store, j.ID, report.Statement); err != nil || len(unlisted) != 0 {
		t.Errorf("objects the manifest does not name: %q, %v; want none: the refused attempt removes its own", unlisted, err)
	}
	waitFor(t, 10*time.Second, "the message acknowledged", b.consumed)
}

// TestStaleAttemptLeavesTheNextDeliveryAlone: a worker paused in its upload past the ack
// deadline resumes while the next attempt is being retried after a transient failure. The stale
// attempt must not ack: the server acks the message, not the delivery, and the job would never
// be delivered again. It runs once more and succeeds.
func TestStaleAttemptLeavesTheNextDeliveryAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	j := b.newJob("p", "t")
	retrying := func() bool {
		st, err := b.q.Status(ctx, j.ID)
		return err == nil && st.State == job.StateRetrying && st.Attempt == 2
	}
	var paused sync.Once
	pausing := &hookStore{Store: b.shared}
	pausing.put = func(key string) error {
		paused.Do(func() { waitFor(t, 30*time.Second, "the next attempt's transient failure", retrying) })
		return nil
	}
	stale := b.worker(agentFunc(writeReport), func(c *runner.Config) {
		c.Store, c.HeartbeatInterval, c.Worker.Concurrency = pausing, time.Hour, 1
	})
	b.publish(j)
	waitFor(t, 10*time.Second, "the first attempt's upload", func() bool {
		st, err := b.q.Status(ctx, j.ID)
		return err == nil && st.Progress == "uploading"
	})
	var failed atomic.Bool
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		if failed.CompareAndSwap(false, true) {
			return agent.Result{}, errors.New("model: connection refused") // transient: retried
		}
		return writeReport(ctx, req)
	}))
	waitFor(t, 30*time.Second, "the stale attempt to end", func() bool {
		return testutil.ToFloat64(stale.m.StaleAttempts) == 1
	})
	if st := b.waitFinal(j.ID, 30*time.Second); st.State != job.StateSucceeded || st.Attempt < 3 {
		t.Fatalf("status = %+v, want succeeded on a third attempt", st)
	}
}

// TestCommitWaitsForAStoreThatRefusesOverwritesAgain (issue 10): a store whose server stopped
// refusing a second create-only put while a job ran refuses the commit (store.ErrUnsafeServer);
// the attempt waits, its delivery kept, and commits once the server refuses overwrites again.
// It neither hands the job back (spending a delivery, running the agent again) nor writes.
func TestCommitWaitsForAStoreThatRefusesOverwritesAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	refused, safe := 0, false
	unsafe := &hookStore{Store: b.shared, put: func(key string) error {
		mu.Lock()
		defer mu.Unlock()
		if safe || !strings.Contains(key, "/attempts/") && !strings.HasSuffix(key, "manifest.json") {
			return nil
		}
		refused++
		return store.ErrUnsafeServer
	}}
	var runs sync.Map
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		n, _ := runs.LoadOrStore(req.JobID, new(int))
		*n.(*int)++
		return writeReport(ctx, req)
	}), func(c *runner.Config) { c.Store = unsafe })
	j := b.submit("p")
	waitFor(t, 30*time.Second, "the commit to be refused three times", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return refused >= 3
	})
	if keys, err := b.store.List(context.Background(), store.RunPrefix(j.ID)); err != nil || len(keys) != 0 {
		t.Errorf("while the store overwrites the run holds %+v (%v), want nothing", keys, err)
	}
	mu.Lock()
	safe = true
	mu.Unlock()

	st := b.waitFinal(j.ID, 30*time.Second)
	if st.State != job.StateSucceeded || st.Attempt != 1 {
		t.Errorf("status %s on attempt %d, want succeeded on attempt 1", st.State, st.Attempt)
	}
	if n, _ := runs.Load(j.ID); *n.(*int) != 1 {
		t.Errorf("the agent ran %d times, want once", *n.(*int))
	}
	if got := string(b.runFile(j.ID, "report.md")); !strings.HasPrefix(got, "# report for "+j.ID) {
		t.Errorf("committed report = %q", got)
	}
}

// TestNATSOutageWhileCommittingKeepsTheRun: NATS goes away while the last delivery uploads
// its run, slowly enough that the upload's progress line is written during the outage, and
// comes back once the worker says it waits for NATS. The attempt commits and waits for NATS to
// record the job's end and take the ack: the job succeeds on that delivery, with no second run,
// no dead letter for work that was done, and no wait of an ack wait for a delivery that adopts
// the run. Before, the progress write, which NATS never answered, held the commit until the
// attempt's deadline, and the worker never said it waited.
func TestNATSOutageWhileCommittingKeepsTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.setAckWait(time.Minute) // the outage must not redeliver the job
	oneDelivery(b)
	uploading, down, progressed := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var once sync.Once
	stops := &hookStore{Store: b.shared, put: func(key string) error {
		once.Do(func() { close(uploading); <-down; <-progressed })
		return nil
	}}
	var runs atomic.Int32
	var log testharness.LogBuffer
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		runs.Add(1)
		return writeReport(ctx, req)
	}), func(c *runner.Config) {
		c.Store, c.Logger = stops, slog.New(slog.NewTextHandler(&log, nil))
		c.Queue = &progressHookQueue{Queue: c.Queue, progress: "uploading", seen: progressed, before: down}
	})
	j := b.submit("p")
	<-uploading
	port := b.srv.Addr().(*net.TCPAddr).Port
	b.srv.Shutdown()
	b.srv.WaitForShutdown()
	close(down)
	waitFor(t, time.Minute, "the worker to wait for NATS", func() bool { return strings.Contains(log.String(), "waiting for NATS") })
	b.start(port)
	b.checkEnd(j.ID, job.StateSucceeded, 0)
	if st := b.waitFinal(j.ID, 30*time.Second); st.Attempt != 1 || runs.Load() != 1 {
		t.Errorf("succeeded on attempt %d after %d runs; want the first and only run committed", st.Attempt, runs.Load())
	}
}

// progressHookQueue closes seen at the first status write that sets progress, and sends that
// write once before is closed.
type progressHookQueue struct {
	runner.Queue
	progress     string
	seen, before chan struct{}
	once         sync.Once
}

func (q *progressHookQueue) UpdateStatus(ctx context.Context, r queue.Ref, change func(*job.Status), conds ...queue.StatusCond) (job.Status, error) {
	var probe job.Status
	if change(&probe); probe.Progress == q.progress {
		q.once.Do(func() { close(q.seen) })
		<-q.before
	}
	return q.Queue.UpdateStatus(ctx, r, change, conds...)
}

// TestJobWhoseEndCannotBeRecordedSaysWhy: a job that fails while the store refuses to record
// its end waits for the store within its attempt, its status saying so, and past the attempt's
// deadline waits for another delivery, its status saying so and why instead of the last step it
// reached; its state stays as it was meanwhile (a cancel then cannot end a job whose run may be
// committed). Once the store takes writes again, the job ends as it should.
func TestJobWhoseEndCannotBeRecordedSaysWhy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.cfg.Profiles["p"]
	p.Limits.JobTimeout = config.Duration(time.Second) // the attempt's waits give up after 2 s
	b.cfg.Profiles = map[string]config.Profile{"p": p}
	var down atomic.Bool
	down.Store(true)
	refusing := &hookStore{Store: b.shared, put: func(key string) error {
		if down.Load() && path.Base(key) == "manifest.json" {
			return errors.New("store unavailable: connection refused")
		}
		return nil
	}}
	j := b.submit("p")
	if err := b.store.Delete(context.Background(), store.InputKey(j.Inputs[0].SHA256)); err != nil {
		t.Fatal(err)
	}
	b.worker(agentFunc(writeReport), func(c *runner.Config) { c.Store = refusing })
	var st job.Status
	waitFor(t, 30*time.Second, "the status to say the attempt waits for the store", func() bool {
		var err error
		st, err = b.q.Status(context.Background(), j.ID)
		return err == nil && strings.HasPrefix(st.Error, "waiting for the store: ")
	})
	if st.State.Terminal() || st.State == job.StateRetrying {
		t.Errorf("status %s while the attempt waits for the store; want its state kept", st.State)
	}
	waitFor(t, 30*time.Second, "the status to say why the job waits", func() bool {
		var err error
		st, err = b.q.Status(context.Background(), j.ID)
		return err == nil && strings.HasPrefix(st.Progress, "waiting for another delivery: ")
	})
	if strings.Contains(st.Progress, "store unavailable") || st.State.Terminal() || st.State == job.StateRetrying {
		t.Errorf("status %s, progress %q; want its state kept and the progress saying why it waits, in the tenant's words, not the store's", st.State, st.Progress)
	}
	down.Store(false)
	if st := b.waitFinal(j.ID, 60*time.Second); st.State != job.StateFailed {
		t.Errorf("status %s once the store took writes, want failed", st.State)
	}
}

// TestStoreOutageStatusNamesNoAddress: while the store does not answer, the job's status
// (what its tenant reads with `submit status`) says it waits for the store, never the store's
// address (its host and port, the request's URL) nor the SDK's words, as a Kubernetes outage's
// status never names the API server's: the worker's log has them, with the job's id. Every
// write fails as an S3 put to a store that refuses connections does, its error built as the
// SDK and net/http build it (no packet is sent: a port closed for the test could be another
// test's server by the time the put dials it).
func TestStoreOutageStatusNamesNoAddress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const addr = "127.0.0.1:39417"
	refused := func(key string) error {
		dial := &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 39417},
			Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
		return fmt.Errorf("store: put s3://boxcar/%s: operation error S3: PutObject, exceeded maximum number of attempts, 1, "+
			"https response error StatusCode: 0, RequestID: , HostID: , request send failed, %w",
			key, &url.Error{Op: "Put", URL: "http://" + addr + "/boxcar/" + key, Err: dial})
	}
	var logs testharness.LogBuffer
	w := b.worker(agentFunc(writeReport), func(c *runner.Config) {
		c.Store, c.Logger = &hookStore{Store: b.shared, put: refused}, slog.New(slog.NewJSONHandler(&logs, nil))
	})
	j := b.submit("p")
	var st job.Status
	var err error
	testharness.Wait(t, "the job's status to say it waits for the store", func() (bool, error) {
		st, err = b.q.Status(context.Background(), j.ID)
		return err == nil && strings.Contains(st.Error, "waiting for the store"), nil
	}, testharness.Within(30*time.Second))
	w.stop()
	t.Logf("the job's status: %s", st.Error)
	if strings.Contains(st.Error, "127.0.0.1") || strings.Contains(st.Error, ":39417") {
		t.Errorf("the status a tenant reads names the store's address %s: %s", addr, st.Error)
	}
	hostPaths{"connection refused"}.inALogLine(t, logs.String(), j.ID, "default")
}
