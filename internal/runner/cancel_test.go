package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
)

// TestCancelStopsOnlyTheJobAsked: a worker runs two jobs at once and one watch serves both; a
// cancel of one stops that one, and the other runs on to success.
func TestCancelStopsOnlyTheJobAsked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	release := map[string]chan struct{}{}
	running := make(chan string, 2)
	w := b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		mu.Lock()
		ch := release[req.JobID]
		mu.Unlock()
		running <- req.JobID
		select {
		case <-ctx.Done():
			return agent.Result{}, ctx.Err()
		case <-ch:
			return writeReport(ctx, req)
		}
	}))
	keep, stop := b.submitHeld(&mu, release), b.submitHeld(&mu, release)
	for range 2 {
		<-running
	}
	if _, err := b.q.Cancel(ctx, stop.ID, "tester"); err != nil {
		t.Fatal(err)
	}
	if st := b.waitFinal(stop.ID, 10*time.Second); st.State != job.StateCancelled {
		t.Fatalf("the job asked to stop ended %s, want cancelled", st.State)
	}
	if st, err := b.q.Status(ctx, keep.ID); err != nil || st.State != job.StateRunning {
		t.Fatalf("the other job is %q (%v), want still running", st.State, err)
	}
	close(release[keep.ID])
	if st := b.waitFinal(keep.ID, 10*time.Second); st.State != job.StateSucceeded {
		t.Fatalf("the other job ended %s: %s, want succeeded", st.State, st.Error)
	}
	w.stop()
}

// submitHeld submits a job whose agent waits until its channel in release is closed.
func (b *bundle) submitHeld(mu *sync.Mutex, release map[string]chan struct{}) job.Job {
	b.t.Helper()
	mu.Lock()
	defer mu.Unlock()
	j := b.submit("p")
	release[j.ID] = make(chan struct{})
	return j
}

// TestCancelAskedWhileNoWorkerRanTheJob: the worker running a job dies, and the job is
// cancelled before its redelivery; the next worker stops it at once, without running the agent.
func TestCancelAskedWhileNoWorkerRanTheJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	j, _ := b.killedMidRun(nil)
	st, err := b.q.Cancel(ctx, j.ID, "tester")
	if err != nil || !st.CancelRequested {
		t.Fatalf("cancel of the running job: %+v, %v; want a cancel request", st, err)
	}

	ran := make(chan struct{}, 1)
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		ran <- struct{}{}
		return writeReport(ctx, req)
	}))
	if st := b.waitFinal(j.ID, 20*time.Second); st.State != job.StateCancelled || st.Attempt != 2 {
		t.Fatalf("status = %+v, want cancelled in attempt 2", st)
	}
	select {
	case <-ran:
		t.Error("the agent ran for a job cancelled before its attempt began")
	default:
	}
}

// TestCancelDuringTheUploadLetsTheCommitWin: the agent finished; while its run is uploaded,
// on the job's last delivery, the job is cancelled. The run is over: its commit wins
// (succeeded), or the job ends cancelled keeping what it produced; never dead. (Classified by
// the cause read before the upload, the upload's "context canceled" was a transient fault:
// dead, dead-lettered max_deliveries, the finished run discarded; classified by the cause
// read after it, cancelled, with only the transcript kept.)
func TestCancelDuringTheUploadLetsTheCommitWin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	oneDelivery(b)
	ctx := context.Background()
	j := b.newJob("p", "t")
	var once atomic.Bool
	cancelling := &hookStore{Store: b.shared}
	cancelling.put = func(key string) error {
		if strings.Contains(key, j.ID+"/attempts/") && once.CompareAndSwap(false, true) {
			if _, err := b.q.Cancel(ctx, j.ID, "tester"); err != nil {
				t.Error(err)
			}
			waitFor(t, 10*time.Second, "the worker to act on the cancel", func() bool {
				st, err := b.q.Status(ctx, j.ID)
				return err == nil && st.CancelRequested
			})
		}
		return nil
	}
	b.worker(agentFunc(writeReport), func(c *runner.Config) { c.Store = cancelling })
	b.publish(j)
	st := b.waitFinal(j.ID, 30*time.Second)
	var letters []string
	for _, dl := range b.settledLetters() {
		if dl.JobID == j.ID {
			letters = append(letters, dl.Reason+": "+dl.Error)
		}
	}
	if !once.Load() {
		t.Fatal("the upload was never seen")
	}
	if st.State != job.StateCancelled && st.State != job.StateSucceeded || len(letters) > 0 {
		t.Errorf("job cancelled during its upload ended %s (error %q), dead letters %q; want cancelled (or succeeded), none", st.State, st.Error, letters)
	}
	// What the run produced is kept: a cancelled run's report says how it ended, then what the
	// job wrote.
	if report := b.runFile(j.ID, "report.md"); !strings.Contains(string(report), "# report for "+j.ID) {
		t.Errorf("the committed report %q does not hold what the run wrote: the finished run was thrown away", report)
	}
	// However it ended, the request, written with no expiry, now expires with the bucket.
	waitFor(t, 20*time.Second, "the cancel request released", func() bool { return cancelReleased(t, b, j.ID) })
}

// cancelReleased reports whether the job's cancel request says it was released
// (queue.ReleaseCancel): it expires with the bucket from then on.
func cancelReleased(t *testing.T, b *bundle, id string) bool {
	t.Helper()
	js, err := jetstream.New(b.nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), queue.CancelBucketOf(job.DefaultTenant))
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(context.Background(), job.DefaultTenant+"."+id)
	var req queue.CancelRequest
	return err == nil && json.Unmarshal(e.Value(), &req) == nil && req.Released
}

// TestCancelledQueuedJobRefusedAtAdmitEndsOnce: a job is cancelled while it waits in the queue
// (the watch records it cancelled), and the worker that then delivers it cannot admit it: its
// profile is one this worker does not define. The cancel came first: the job ends cancelled,
// once (a manifest that says so, no dead letter), not also rejected and dead-lettered as
// unknown_profile under a status that says cancelled; nor, when a live peer defines the
// profile, handed from delivery to delivery until its last one rejects it.
func TestCancelledQueuedJobRefusedAtAdmitEndsOnce(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		peer bool
	}{{"no peer defines its profile", false}, {"a live peer defines its profile", true}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			if tt.peer {
				advertise(t, b, "worker-new", map[string]config.Profile{"p": b.cfg.Profiles["p"], "q": b.cfg.Profiles["p"]})
			}
			j := b.newJob("q", "t") // a profile this worker does not define
			b.publish(j)
			if st, err := b.q.Cancel(ctx, j.ID, "tester"); err != nil || !st.CancelRequested {
				t.Fatalf("cancel of the queued job: %+v, %v", st, err)
			}
			b.worker(agentFunc(writeReport))
			final := b.waitFinal(j.ID, 20*time.Second)
			waitFor(t, 20*time.Second, "the job's manifest", func() bool {
				_, err := b.store.Stat(ctx, store.ManifestKey(j.ID))
				return err == nil
			})
			waitFor(t, 20*time.Second, "the job to be consumed", b.consumed)
			m := b.manifest(j.ID)
			if final.State != job.StateCancelled || m.Predicate.Outcome.State != job.StateCancelled {
				t.Errorf("status %s (%q), manifest %s (%q); want both cancelled", final.State, final.Error, m.Predicate.Outcome.State, m.Predicate.Outcome.Error)
			}
			if dls := reasons(b.deadLetters()); len(dls) > 0 {
				t.Errorf("a job cancelled before it started was dead-lettered: %q", dls)
			}
			if m.Predicate.Attempt != 1 {
				t.Errorf("the job ended at delivery %d; want its first, which found it cancelled", m.Predicate.Attempt)
			}
		})
	}
}

// advertise publishes, as a live worker does from its start, that worker id defines profiles,
// all of them granted to the default tenant, until the test ends.
func advertise(t *testing.T, b *bundle, id string, profiles map[string]config.Profile) {
	t.Helper()
	granted := slices.Collect(maps.Keys(profiles))
	advertiseTenants(t, b, id, profiles, map[string]config.Tenant{job.DefaultTenant: {Profiles: granted}})
}

// advertiseTenants is advertise with the tenants given, once the profiles are live (the only
// ones: each test has a NATS server of its own). stop ends it before the test does.
func advertiseTenants(t *testing.T, b *bundle, id string, profiles map[string]config.Profile, tenants map[string]config.Tenant) (stop func()) {
	t.Helper()
	_, q := b.connect()
	ctx, cancel := context.WithCancel(context.Background())
	advertised := make(chan struct{})
	go func() {
		defer close(advertised)
		_ = q.AdvertiseProfiles(ctx, id, profiles, tenants)
	}()
	stop = sync.OnceFunc(func() { cancel(); <-advertised })
	t.Cleanup(stop)
	waitFor(t, 10*time.Second, id+"'s profiles published", func() bool {
		live, err := b.q.LiveProfiles(context.Background())
		return err == nil && len(live) == 1
	})
	return stop
}

// TestCancelledJobWhoseLastDeliveryDiedEndsCancelled: the worker of a job's last delivery dies
// mid-run, and the job is cancelled before the delivery after it (exhausted) comes. That
// delivery never runs the job, and ends it cancelled, not dead: the user stopped it before its
// end was decided, and there is nothing for anyone to look into (no dead letter).
func TestCancelledJobWhoseLastDeliveryDiedEndsCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	oneDelivery(b)
	j, _ := b.killedMidRun(nil)
	if _, err := b.q.Cancel(context.Background(), j.ID, "tester"); err != nil {
		t.Fatal(err)
	}
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		t.Errorf("an exhausted job ran again")
		return writeReport(ctx, req)
	}))
	b.checkEnd(j.ID, job.StateCancelled, 0)
}

// slowStore delays the puts delay names (outside any lock, so that other writers go on).
type slowStore struct {
	store.Store
	delay func(key string)
}

func (s *slowStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	s.delay(key)
	return s.Store.Put(ctx, key, r, size)
}

func (s *slowStore) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	s.delay(key)
	return s.Store.PutIfAbsent(ctx, key, r, size)
}

// TestCancelledRunsSlowCommitKeepsItsDelivery: a job is cancelled mid-run, and the upload of
// what its run produced takes longer than the consumer's ack wait (a slow store, large
// artifacts). The cancel ends the attempt's context, not the delivery's heartbeats: the
// delivery stays this attempt's until it settles, so the server does not deliver the job
// again meanwhile. The run's commit wins and the job ends cancelled with what the run produced
// ("a run cancelled before keeps what it produced"): not dead and dead-lettered
// max_deliveries by a redelivery on the last delivery, nor committed by a redelivery on an
// earlier one as a one-line cancelled manifest, the run's report thrown away.
func TestCancelledRunsSlowCommitKeepsItsDelivery(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		last bool
	}{{"last delivery", true}, {"earlier delivery", false}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			if tt.last {
				oneDelivery(b)
			}
			b.setAckWait(3 * time.Second)
			ctx := context.Background()
			j := b.newJob("p", "t")
			var once atomic.Bool
			slow := &slowStore{Store: b.shared, delay: func(key string) {
				if strings.Contains(key, j.ID+"/attempts/1-") && once.CompareAndSwap(false, true) {
					time.Sleep(7 * time.Second) // over two ack waits: the store is slow, not down
				}
			}}
			started := make(chan struct{}, 1)
			b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
				if req.Spent.Turns > 0 {
					return agent.Result{}, errors.New("the job ran again") // not this test's point
				}
				req.Progress(agent.Event{Kind: agent.EventModelRequest, Turn: 1, MaxToolCalls: 30, Spent: agent.Budget{Turns: 1}})
				if err := req.Sandbox.WriteFile(ctx, "report.md", []byte("# half a report for "+req.JobID+"\n")); err != nil {
					return agent.Result{}, err
				}
				started <- struct{}{}
				<-ctx.Done()
				return agent.Result{Turns: 1}, ctx.Err()
			}), func(c *runner.Config) { c.Store = slow; c.CleanupTimeout = 30 * time.Second })
			b.publish(j)
			<-started
			if _, err := b.q.Cancel(ctx, j.ID, "tester"); err != nil {
				t.Fatal(err)
			}
			st := b.waitFinal(j.ID, 40*time.Second)
			waitFor(t, 40*time.Second, "the job to be consumed", b.consumed)
			m := b.manifest(j.ID)
			var letters []string
			for _, dl := range b.deadLetters() {
				if dl.JobID == j.ID {
					letters = append(letters, dl.Reason+": "+dl.Error)
				}
			}
			if st.State != job.StateCancelled || m.Predicate.Outcome.State != job.StateCancelled || len(letters) > 0 {
				t.Errorf("job cancelled mid-run ended: status %s (%q), manifest %s (attempt %d), dead letters %q; want cancelled, no dead letter",
					st.State, st.Error, m.Predicate.Outcome.State, m.Predicate.Attempt, letters)
			}
			if m.Predicate.Attempt != 1 {
				t.Errorf("the committed manifest is attempt %d's, not the cancelled run's (attempt 1): what the run produced was discarded", m.Predicate.Attempt)
			}
			if got := string(b.runFile(j.ID, "report.md")); !strings.Contains(got, "half a report for "+j.ID) {
				t.Errorf("the committed report.md does not hold what the cancelled run wrote:\n%s", got)
			}
		})
	}
}

// slowStartProvider is a backend whose sandbox takes long to start (a pod pulling its image):
// Start returns only when its context ends.
type slowStartProvider struct {
	fakeProvider
	starting chan struct{}
}

func (p *slowStartProvider) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	p.starting <- struct{}{}
	<-ctx.Done()
	return nil, context.Cause(ctx)
}

// TestCancelledStartIsNoSandboxFailure: a job is cancelled, or the worker drains, while its
// sandbox starts. The backend did nothing wrong: boxcar_sandbox_failures_total{stage="start"},
// which the chart's BoxcarSandboxStartFailures alert reads (failures over failures plus
// starts), does not count it.
func TestCancelledStartIsNoSandboxFailure(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cut  func(b *bundle, w *worker, j job.Job)
	}{
		{name: "cancelled", cut: func(b *bundle, w *worker, j job.Job) {
			if _, err := b.q.Cancel(context.Background(), j.ID, "tester"); err != nil {
				t.Fatal(err)
			}
			if st := b.waitFinal(j.ID, 20*time.Second); st.State != job.StateCancelled {
				t.Errorf("the job ended %s: %s, want cancelled", st.State, st.Error)
			}
		}},
		{name: "drained", cut: func(b *bundle, w *worker, j job.Job) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			p := &slowStartProvider{starting: make(chan struct{}, 1)}
			w := b.worker(agentFunc(writeReport), func(c *runner.Config) { c.Sandboxes = p })
			j := b.submit("p")
			select {
			case <-p.starting:
			case <-time.After(30 * time.Second):
				t.Fatal("the sandbox never began to start")
			}
			tt.cut(b, w, j)
			w.stop()
			if got := testutil.ToFloat64(w.m.SandboxFailed.WithLabelValues("fake", "start")); got != 0 {
				t.Errorf("boxcar_sandbox_failures_total{backend=\"fake\",stage=\"start\"} = %v after a start cut short (%s); want 0", got, tt.name)
			}
		})
	}
}
