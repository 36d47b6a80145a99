package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
	"github.com/boxcar-run/boxcar/internal/spawn"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(spawn.StarterFunc))
}

type bundle struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	w   *queue.Consumer // nil from olderSetup until the test starts a worker
	c   *queue.Client
	cfg config.NATS
}

// setup starts the real nats-server in-process with file storage that fsyncs every write, and
// a queue with a short AckWait so redelivery is observable.
func setup(t testing.TB, change ...func(*config.NATS)) bundle {
	t.Helper()
	nc := connect(t, true)
	cfg := config.Config{}.WithDefaults().NATS
	cfg.AckWait = config.Duration(time.Second)
	cfg.MaxDeliver = 3
	for _, c := range change {
		c(&cfg)
	}
	return start(t, nc, cfg)
}

// start is a worker's start on nc's server with cfg (queue.Open, which declares as `worker
// setup` does) and a client of the tests' tenant.
func start(t testing.TB, nc *nats.Conn, cfg config.NATS) bundle {
	t.Helper()
	ctx := context.Background()
	w, err := queue.Open(ctx, nc, cfg, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	c, err := queue.NewClient(ctx, nc, cfg, tenant)
	if err != nil {
		t.Fatal(err)
	}
	return bundle{nc: nc, js: jetStream(t, nc), w: w, c: c, cfg: cfg}
}

// open starts another worker's consumer on b's server with cfg, for tenants (nil: the default
// tenant alone), logging as text to log (nil: nowhere).
func (b bundle) open(t testing.TB, cfg config.NATS, tenants map[string]config.Tenant, log io.Writer) *queue.Consumer {
	t.Helper()
	logger := slog.New(slog.DiscardHandler)
	if log != nil {
		logger = slog.New(slog.NewTextHandler(log, nil))
	}
	w, err := queue.Open(t.Context(), b.nc, cfg, tenants, logger)
	if err != nil {
		t.Fatalf("open a consumer: %v", err)
	}
	return w
}

// client is a client of tenant on b's server.
func (b bundle) client(t testing.TB, tenant string) *queue.Client {
	t.Helper()
	c, err := queue.NewClient(t.Context(), b.nc, b.cfg, tenant)
	if err != nil {
		t.Fatalf("a client of %s: %v", tenant, err)
	}
	return c
}

// submit publishes a new job with b's client and returns it.
func (b bundle) submit(t *testing.T) job.Job {
	t.Helper()
	j := newJob(t)
	if _, err := b.c.Publish(t.Context(), j); err != nil {
		t.Fatalf("publish: %v", err)
	}
	return j
}

// watch watches the status of job id for up to within.
func (b bundle) watch(t *testing.T, id string, within time.Duration) <-chan job.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	t.Cleanup(cancel)
	updates, err := b.c.WatchStatus(ctx, id)
	if err != nil {
		t.Fatalf("watch %s: %v", id, err)
	}
	return updates
}

// tenant is the tenant the tests' clients act for.
const tenant = "default"

// ref names a job of the tests' tenant as a worker knows it.
func ref(id string) queue.Ref { return queue.Ref{Tenant: tenant, ID: id} }

// deadLetters returns the count of dead letters by subject in the tests' tenant's dead-letter
// stream and the shared one, and fails t for a job with more than one dead letter: a job is
// lettered once, however many attempts Term it.
func (b bundle) deadLetters(t *testing.T) map[string]uint64 {
	t.Helper()
	all := map[string]uint64{}
	for _, name := range []string{queue.DeadLetterStream(b.cfg, tenant), b.cfg.DeadLetterStream} {
		stream, err := b.js.Stream(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := stream.Info(t.Context(), jetstream.WithSubjectFilter(">"))
		if err != nil {
			t.Fatal(err)
		}
		maps.Copy(all, info.State.Subjects)
	}
	for subject, n := range all {
		if n != 1 {
			t.Errorf("%s holds %d dead letters, want 1", subject, n)
		}
	}
	return all
}

// deadLetter is job r's one dead letter, wherever it is (queue.DeadLetterOf); it fails t when
// there is none.
func (b bundle) deadLetter(t *testing.T, r queue.Ref) queue.DeadLetter {
	t.Helper()
	data, err := queue.DeadLetterOf(t.Context(), b.nc, b.cfg, r)
	if err != nil {
		t.Fatalf("no dead letter for %s: %v", r, err)
	}
	var dl queue.DeadLetter
	if err := json.Unmarshal(data, &dl); err != nil {
		t.Fatalf("the dead letter of %s: %v", r, err)
	}
	return dl
}

// olderSetup starts the real nats-server with the job stream already there as an older (or a
// foreign) Boxcar made it: the settings Boxcar's job stream had before it recorded its limits,
// with change applied. No worker has started; the test starts one with queue.New.
func olderSetup(t testing.TB, cfg config.NATS, change func(*jetstream.StreamConfig)) (bundle, jetstream.Stream) {
	t.Helper()
	nc := connect(t, false)
	js := jetStream(t, nc)
	sc := jetstream.StreamConfig{Name: cfg.Stream, Description: "Boxcar jobs", Subjects: []string{cfg.Subject},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Duplicates: time.Duration(cfg.DuplicateWindow),
		MaxMsgSize: job.MaxMessageBytes + 4096}
	change(&sc)
	stream, err := js.CreateStream(context.Background(), sc)
	if err != nil {
		t.Fatal(err)
	}
	return bundle{nc: nc, js: js, cfg: cfg}, stream
}

func jetStream(t testing.TB, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// connect starts the real nats-server in-process on file storage and connects to it.
func connect(t testing.TB, syncAlways bool) *nats.Conn {
	t.Helper()
	_, nc := queuetest.Connect(t, queue.EmbeddedOptions{SyncAlways: syncAlways})
	return nc
}

func newJob(t *testing.T) job.Job {
	t.Helper()
	return job.Job{Version: job.Version, ID: job.NewID(), Profile: "p", Task: "t", SubmittedAt: time.Now().UTC()}
}

func fetch(t *testing.T, q *queue.Consumer, within time.Duration) *queue.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	d, err := q.Fetch(ctx)
	if err != nil {
		t.Fatalf("fetch: %v", err)
	}
	return d
}

func expectEmpty(t *testing.T, q *queue.Consumer, for_ time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), for_)
	defer cancel()
	if d, err := q.Fetch(ctx); err == nil {
		t.Fatalf("got a delivery of %s (attempt %d), want none", d.JobID, d.Attempt)
	}
}

func TestPublishFetchAck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	j := newJob(t)
	if dup, err := b.c.Publish(ctx, j); err != nil || dup {
		t.Fatalf("publish: dup=%v err=%v", dup, err)
	}
	st, err := b.c.Status(ctx, j.ID)
	if err != nil || st.State != job.StateQueued {
		t.Fatalf("status after publish = %+v, %v; want queued", st, err)
	}
	d := fetch(t, b.w, 5*time.Second)
	if d.JobID != j.ID || d.Attempt != 1 {
		t.Fatalf("delivery = %s attempt %d, want %s attempt 1", d.JobID, d.Attempt, j.ID)
	}
	got, err := job.Decode(d.Data)
	if err != nil || got.ID != j.ID {
		t.Fatalf("decode delivered job: %v", err)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	expectEmpty(t, b.w, 2*b.w.AckWait())
}

func TestDuplicatePublishIsDropped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	j := b.submit(t)
	dup, err := b.c.Publish(ctx, j)
	if err != nil || !dup {
		t.Fatalf("second publish: dup=%v err=%v; want a duplicate", dup, err)
	}
	d := fetch(t, b.w, 5*time.Second)
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	expectEmpty(t, b.w, 500*time.Millisecond)
}

func TestUnackedJobIsRedelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.submit(t)
	first := fetch(t, b.w, 5*time.Second)
	// The worker "dies": no ack, no heartbeat. After AckWait the job comes back.
	second := fetch(t, b.w, 5*time.Second)
	if second.JobID != first.JobID || second.Attempt != 2 {
		t.Fatalf("redelivery = %s attempt %d, want %s attempt 2", second.JobID, second.Attempt, first.JobID)
	}
	if err := second.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestKeepAliveHoldsTheJobPastAckWait(t *testing.T) {
	t.Parallel()
	// Heartbeats every 1.7 s: a busy machine that stalls this process for a second or two
	// must not redeliver the job (the other tests' 1 s would).
	b := setup(t, func(c *config.NATS) { c.AckWait = config.Duration(5 * time.Second) })
	ctx := context.Background()
	b.submit(t)
	d := fetch(t, b.w, 5*time.Second)
	stop := d.KeepAlive(ctx, 0)
	expectEmpty(t, b.w, 2*b.w.AckWait())
	stop()
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestNakRedeliversAfterDelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.submit(t)
	d := fetch(t, b.w, 5*time.Second)
	start := time.Now()
	if err := d.Nak(ctx, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	again := fetch(t, b.w, 5*time.Second)
	if since := time.Since(start); since < 250*time.Millisecond {
		t.Errorf("redelivered after %s, want at least the 300ms delay", since)
	}
	if again.Attempt != 2 {
		t.Errorf("attempt = %d, want 2", again.Attempt)
	}
	if err := again.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestTermKeepsTheJobInTheDeadLetterStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	j := b.submit(t)
	d := fetch(t, b.w, 5*time.Second)
	if lettered, err := d.Term(ctx, "unknown_profile", errors.New(`unknown profile "p"`)); err != nil || !lettered {
		t.Fatalf("Term: lettered %v, %v; want the letter written", lettered, err)
	}
	expectEmpty(t, b.w, 2*b.w.AckWait())

	// In the tenant's own dead-letter stream, under the job's id.
	own := queue.DeadLetterStream(b.cfg, tenant)
	stream, err := b.js.Stream(ctx, own)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.GetLastMsgForSubject(ctx, own+"."+j.ID)
	if err != nil {
		t.Fatalf("no dead letter for %s in %s: %v", j.ID, own, err)
	}
	var dl queue.DeadLetter
	if err := json.Unmarshal(msg.Data, &dl); err != nil {
		t.Fatal(err)
	}
	if dl.JobID != j.ID || dl.Reason != "unknown_profile" || dl.Attempt != 1 {
		t.Errorf("dead letter = %+v", dl)
	}
	if orig, err := job.Decode(dl.Original); err != nil || orig.ID != j.ID {
		t.Errorf("dead letter lost the original payload: %v", err)
	}
}

func TestStatusUpdatesAndTerminalStatesAreFinal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	j := b.submit(t)
	updates := b.watch(t, j.ID, 10*time.Second)
	steps := []job.State{job.StateRunning, job.StateSucceeded}
	for _, s := range steps {
		if _, err := b.w.UpdateStatus(ctx, ref(j.ID), func(st *job.Status) { st.State = s }); err != nil {
			t.Fatal(err)
		}
	}
	// A stale attempt may not overwrite the final outcome.
	if _, err := b.w.UpdateStatus(ctx, ref(j.ID), func(st *job.Status) { st.State = job.StateFailed }); !errors.Is(err, queue.ErrFinal) {
		t.Fatalf("update after success: %v, want ErrFinal", err)
	}
	var seen []job.State
	for st := range updates {
		if len(seen) == 0 || seen[len(seen)-1] != st.State {
			seen = append(seen, st.State)
		}
	}
	if last := seen[len(seen)-1]; last != job.StateSucceeded {
		t.Errorf("watch ended at %v (saw %v), want succeeded", last, seen)
	}
	if _, err := b.c.Status(ctx, "nosuchjob-0000"); !errors.Is(err, queue.ErrUnknownJob) {
		t.Errorf("status of unknown job: %v, want ErrUnknownJob", err)
	}
}

// A watcher reads the status by polling (a tenant creates no consumer), so steps that follow
// each other within a millisecond (a file tool call between two model turns) may be skipped;
// what it shows is in the order written, never twice, and always ends with the terminal one.
func TestWatchShowsRapidStepsInOrderAndTheEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	j := b.submit(t)
	updates := b.watch(t, j.ID, 10*time.Second)
	const steps = 200
	writer := make(chan struct{})
	defer func() { <-writer }()
	go func() {
		defer close(writer)
		for i := 1; i <= steps; i++ {
			if _, err := b.w.UpdateStatus(ctx, ref(j.ID), func(st *job.Status) {
				st.State, st.Progress = job.StateRunning, fmt.Sprintf("step %d", i)
			}); err != nil {
				t.Error(err)
				return
			}
		}
		if _, err := b.w.UpdateStatus(ctx, ref(j.ID), func(st *job.Status) { st.State, st.Progress = job.StateSucceeded, "" }); err != nil {
			t.Error(err)
		}
	}()
	last, shown := 0, 0
	var end job.State
	for st := range updates {
		end = st.State
		if st.State != job.StateRunning {
			continue
		}
		var n int
		if _, err := fmt.Sscanf(st.Progress, "step %d", &n); err != nil || n <= last {
			t.Fatalf("watch showed %q after step %d: out of order or again", st.Progress, last)
		}
		last, shown = n, shown+1
	}
	if end != job.StateSucceeded {
		t.Errorf("watch ended at %q after step %d; want succeeded", end, last)
	}
	t.Logf("the watch showed %d of %d steps, then succeeded", shown, steps)
}

func TestBindWithoutWorkerSaysWhatToStart(t *testing.T) {
	t.Parallel()
	nc := connect(t, false)
	ctx := context.Background()
	_, err := queue.NewClient(ctx, nc, config.Config{}.WithDefaults().NATS, "default")
	if !errors.Is(err, queue.ErrNotReady) {
		t.Fatalf("bind: %v, want ErrNotReady", err)
	}
}

func TestSetupIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 2 {
		b.open(t, b.cfg, nil, nil)
	}
}

func TestIncompatibleStreamIsRefusedWithAFix(t *testing.T) {
	t.Parallel()
	cfg := config.Config{}.WithDefaults().NATS
	// A foreign set-up of the tenant's stream with limits retention: a work queue cannot take
	// its place.
	nc := connect(t, false)
	jobs := queue.JobStream(cfg, tenant)
	if _, err := jetStream(t, nc).CreateStream(t.Context(), jetstream.StreamConfig{Name: jobs, Subjects: []string{cfg.Subject + "." + tenant + ".*"},
		Retention: jetstream.LimitsPolicy}); err != nil {
		t.Fatal(err)
	}
	_, err := queue.Open(context.Background(), nc, cfg, nil, slog.New(slog.DiscardHandler))
	if err == nil {
		t.Fatal("set-up over an incompatible stream succeeded")
	}
	if !strings.Contains(err.Error(), "nats stream rm "+jobs) {
		t.Errorf("error %q does not say how to fix it", err)
	}
}

// TestJobWhoseLastWorkerDiedIsDeliveredOnceMore (issue 10 item 1): when the worker holding a
// job's last delivery dies, the server delivers it again, marked exhausted, instead of ending it
// with an advisory nobody may hear; the worker that gets it ends the job.
func TestJobWhoseLastWorkerDiedIsDeliveredOnceMore(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *config.NATS) { c.MaxDeliver = 2 })
	ctx := context.Background()
	j := b.submit(t)
	// Two deliveries, and the worker holding each one dies without a word.
	for i := 0; i < 2; i++ {
		if d := fetch(t, b.w, 5*time.Second); d.Exhausted() {
			t.Fatalf("delivery %d is marked exhausted, want only those after max_deliver", d.Attempt)
		}
	}
	// No worker was listening meanwhile; the next one to ask gets the job once more.
	d := fetch(t, b.w, 10*time.Second)
	if d.JobID != j.ID || d.Attempt != 3 || !d.Exhausted() || !d.LastAttempt() {
		t.Fatalf("delivery %s attempt %d, exhausted %v; want %s, attempt 3, exhausted", d.JobID, d.Attempt, d.Exhausted(), j.ID)
	}
	if _, err := d.Term(ctx, "max_deliveries", errors.New("gave up")); err != nil {
		t.Fatal(err)
	}
	if letters := b.deadLetters(t); len(letters) != 1 {
		t.Errorf("dead-letter streams hold %v, want the job's one letter", letters)
	}
}

// TestTwoDeliveriesEndingAJobAtOnceLeaveOneDeadLetter: a stale delivery and the one after it
// (the first's ack deadline passed) terminating the same job at the same moment leave one
// dead letter, not two: the server refuses the second, as the first is on the subject, and
// only the Term that wrote it says so.
func TestTwoDeliveriesEndingAJobAtOnceLeaveOneDeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const jobs = 10
	ids := map[string]bool{}
	for range jobs {
		j := newJob(t)
		ids[j.ID] = true
		if _, err := b.c.Publish(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	// Every job delivered twice: the first deliveries are left to time out.
	held := map[string][]*queue.Delivery{}
	for len(held) < jobs || slices.ContainsFunc(slices.Collect(maps.Values(held)), func(ds []*queue.Delivery) bool { return len(ds) < 2 }) {
		d := fetch(t, b.w, 10*time.Second)
		held[d.JobID] = append(held[d.JobID], d)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var lettered atomic.Int64 // the Terms that say they wrote the letter: one a job
	for _, ds := range held {
		for _, d := range ds[:2] {
			wg.Go(func() {
				<-start
				wrote, err := d.Term(ctx, "input_missing", errors.New("gone"))
				if err != nil {
					t.Errorf("term delivery %d of %s: %v", d.Attempt, d.JobID, err)
				}
				if wrote {
					lettered.Add(1)
				}
			})
		}
	}
	close(start)
	wg.Wait()
	if n := lettered.Load(); n != jobs {
		t.Errorf("%d Terms of %d jobs said they wrote its dead letter, want one a job", n, jobs)
	}

	if subjects := b.deadLetters(t); len(subjects) != jobs {
		t.Errorf("%d jobs have dead letters, want %d", len(subjects), jobs)
	}
}

// upgrade is the opening of an upgrade's test: a server an older Boxcar used, on which no
// worker of this version has started yet, with the default names, and a context that ends with
// the test, within a minute.
type upgrade struct {
	ctx context.Context
	nc  *nats.Conn
	js  jetstream.JetStream
	cfg config.NATS
}

func newUpgrade(t *testing.T, syncAlways bool) upgrade {
	t.Helper()
	nc := connect(t, syncAlways)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return upgrade{ctx: ctx, nc: nc, js: jetStream(t, nc), cfg: config.Config{}.WithDefaults().NATS}
}

// olderBucket makes the shared bucket name as an older Boxcar made it (nats.go's settings,
// roll-ups allowed), keeping history values of a key.
func (u upgrade) olderBucket(t *testing.T, name string, history uint8) jetstream.KeyValue {
	t.Helper()
	kv, err := u.js.CreateKeyValue(u.ctx, jetstream.KeyValueConfig{Bucket: name, History: history})
	if err != nil {
		t.Fatalf("an older Boxcar's bucket %s: %v", name, err)
	}
	return kv
}
