package queue_test

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

// olderFleet is an older Boxcar's layout, as TestSharedJobStreamDrainsIntoTenantStreams makes
// it: every tenant's jobs in one stream, nats.stream, and a consumer of each tenant on it (an
// old worker's, ack wait oldAckWait), before `worker setup` of this version ran.
type olderFleet struct {
	bundle
	tenants map[string]config.Tenant
	old     map[string]jetstream.Consumer
}

const oldAckWait = 30 * time.Minute // no busy machine outlasts it: an old worker's job is not delivered again

// drainConfig is the NATS settings of the fleet an upgrade drains: an ack wait no busy machine
// outlasts, so a job the test holds, running, is not delivered again.
func drainConfig() config.NATS {
	cfg := config.Config{}.WithDefaults().NATS
	cfg.AckWait = config.Duration(time.Hour)
	return cfg
}

func newOlderFleet(t *testing.T, cfg config.NATS, tenants ...string) olderFleet {
	t.Helper()
	subjects := make([]string, 0, len(tenants))
	for _, tenant := range tenants {
		subjects = append(subjects, cfg.Subject+"."+tenant+".*")
	}
	b, shared := olderSetup(t, cfg, func(c *jetstream.StreamConfig) {
		c.Subjects = subjects
		c.MaxMsgsPerSubject, c.DiscardNewPerSubject, c.Discard = 1, true, jetstream.DiscardNew
	})
	f := olderFleet{bundle: b, tenants: map[string]config.Tenant{}, old: map[string]jetstream.Consumer{}}
	for _, tenant := range tenants {
		c, err := shared.CreateOrUpdateConsumer(t.Context(), jetstream.ConsumerConfig{Durable: cfg.Consumer + "-" + tenant, FilterSubjects: []string{cfg.Subject + "." + tenant + ".*"},
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: oldAckWait, MaxDeliver: -1})
		if err != nil {
			t.Fatal(err)
		}
		f.old[tenant], f.tenants[tenant] = c, config.Tenant{}
	}
	return f
}

// publishOld queues job id of tenant in the shared stream, as an older submit did.
func (f olderFleet) publishOld(t *testing.T, tenant, id string) {
	t.Helper()
	data, err := job.Job{Version: job.Version, ID: id, Profile: "p", Task: "t", SubmittedAt: time.Now().UTC()}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.js.Publish(t.Context(), f.cfg.Subject+"."+tenant+"."+id, data, jetstream.WithExpectStream(f.cfg.Stream)); err != nil {
		t.Fatalf("publish %s's job as an older submit: %v", tenant, err)
	}
}

// runOld has an old worker take tenant's next job in the shared stream and hold it, running.
func (f olderFleet) runOld(t *testing.T, tenant string) jetstream.Msg {
	t.Helper()
	m, err := f.old[tenant].Next(jetstream.FetchMaxWait(harness.Timeout(10 * time.Second)))
	if err != nil {
		t.Fatalf("an old worker takes %s's job: %v", tenant, err)
	}
	return m
}

// setUp runs `worker setup` of this version with the fleet's config.
func (f olderFleet) setUp(t *testing.T) {
	t.Helper()
	admin, err := queue.NewAdmin(f.nc, f.cfg, f.tenants, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Declare(t.Context()); err != nil {
		t.Fatalf("worker setup on the shared stream of an older Boxcar: %v", err)
	}
}

// submit publishes job id of tenant with this version's client: in the tenant's stream.
func (f olderFleet) submit(t *testing.T, tenant, id string) {
	t.Helper()
	j := job.Job{Version: job.Version, ID: id, Profile: "p", Task: "t", SubmittedAt: time.Now().UTC()}
	if dup, err := f.client(t, tenant).Publish(t.Context(), j); err != nil || dup {
		t.Fatalf("submit %s's job %s: duplicate %v, %v", tenant, id, dup, err)
	}
}

// lagOf waits for the worker's lag of each tenant to be want's (the server counts a consumer's
// pending messages after it stores them, not with the publish ack).
func lagOf(t *testing.T, w *queue.Consumer, want map[string][2]uint64) {
	t.Helper()
	harness.Wait(t, "the worker's lag to count every job of its tenants", func() (bool, error) {
		lags, err := w.ConsumerLag(t.Context())
		if err != nil {
			t.Fatalf("ConsumerLag: %v", err)
		}
		got := map[string][2]uint64{}
		for _, l := range lags {
			got[l.Tenant] = [2]uint64{l.Pending, l.AckPending}
		}
		return maps.Equal(got, want), fmt.Errorf("(pending, in flight) by tenant %v, want %v", got, want)
	}, harness.Within(10*time.Second))
}

// TestDrainingJobsCountInTheLag: while the shared stream of an older Boxcar holds jobs of a
// tenant, the lag the worker reports (boxcar_queue_pending_jobs, and the warm pool's demand)
// counts them, waiting or running on an old worker, with the tenant's jobs in its own stream:
// before, a tenant whose every job waited in the shared stream showed no demand, and a pool
// warmed nothing for it. Once drained, the lag is the tenant's stream's alone.
func TestDrainingJobsCountInTheLag(t *testing.T) {
	t.Parallel()
	cfg := drainConfig()
	f := newOlderFleet(t, cfg, "team-a", "team-b")
	for range 3 {
		f.publishOld(t, "team-a", job.NewID())
	}
	held := f.runOld(t, "team-a")
	f.setUp(t)
	f.submit(t, "team-a", job.NewID())
	f.submit(t, "team-b", job.NewID())
	w := f.open(t, cfg, f.tenants, nil)
	lagOf(t, w, map[string][2]uint64{"team-a": {3, 1}, "team-b": {1, 0}})

	var ds []*queue.Delivery
	for range 4 {
		ds = append(ds, fetch(t, w, harness.Timeout(30*time.Second)))
	}
	lagOf(t, w, map[string][2]uint64{"team-a": {0, 4}, "team-b": {0, 1}})
	for _, d := range ds {
		if err := d.Ack(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if err := held.DoubleAck(t.Context()); err != nil {
		t.Fatal(err)
	}
	lagOf(t, w, map[string][2]uint64{"team-a": {0, 0}, "team-b": {0, 0}})
	f.waitDrained(t, w, "team-a")
	lagOf(t, w, map[string][2]uint64{"team-a": {0, 0}, "team-b": {0, 0}})
}

// waitDrained fetches with w until it removed tenant's consumer on the shared stream.
func (f olderFleet) waitDrained(t *testing.T, w *queue.Consumer, tenant string) {
	t.Helper()
	harness.Wait(t, "the worker to remove "+tenant+"'s consumer on the drained shared stream", func() (bool, error) {
		expectEmpty(t, w, time.Second)
		_, err := f.js.Consumer(t.Context(), f.cfg.Stream, f.cfg.Consumer+"-"+tenant)
		return err == jetstream.ErrConsumerNotFound, err //nolint:errorlint // the sentinel itself
	})
}

// TestDrainingTenantCostsNoWaitPerRound: while an old worker runs a tenant's last job in the
// shared stream, the new worker's fetches do not ask that tenant's consumer there (a pull that
// waits, and a look at the stream) before each pull of the tenant's own stream: it finds nothing
// to pull, and asks again only after a while. Before, every round of every fetch asked it
// first, and each of the tenant's new jobs waited that long. The job is not forgotten: handed
// back by the old worker, the new one runs it.
func TestDrainingTenantCostsNoWaitPerRound(t *testing.T) {
	t.Parallel()
	cfg := drainConfig()
	f := newOlderFleet(t, cfg, "team-a", "team-b")
	last := job.NewID()
	f.publishOld(t, "team-a", last)
	held := f.runOld(t, "team-a")
	f.setUp(t)
	w := f.open(t, cfg, f.tenants, nil)

	var asks atomic.Int64
	sub, err := f.nc.Subscribe("$JS.API.CONSUMER.MSG.NEXT."+cfg.Stream+"."+cfg.Consumer+"-team-a", func(*nats.Msg) { asks.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	const jobs = 6
	began := time.Now()
	for range jobs {
		f.submit(t, "team-a", job.NewID())
		d := fetch(t, w, harness.Timeout(30*time.Second))
		if err := d.Ack(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// One look at first, and one for each time the worker may look again in between.
	if got, most := asks.Load(), 1+int64(time.Since(began)/queue.DrainLook); got > most {
		t.Errorf("%d fetches of the tenant's new jobs asked its consumer on the shared stream %d times, where another worker holds its last job; want at most %d", jobs, got, most)
	}

	if err := held.Nak(); err != nil { // the old worker stops
		t.Fatal(err)
	}
	d := fetch(t, w, harness.Timeout(time.Minute))
	if d.JobID != last {
		t.Fatalf("after the old worker handed back job %s the worker fetched %s", last, d.JobID)
	}
	if err := d.Ack(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.waitDrained(t, w, "team-a")
}

// TestJobSubmittedAgainWhileItsCopyDrains: a job id submitted again while its copy from before
// the upgrade waits in the shared stream, or runs from it on an old worker, is queued in the
// tenant's stream as well (neither stream knows the other's jobs). The worker runs the job
// once: it drops the second copy when it fetches it while the first is in the shared stream.
// Before, both were delivered, and two workers ran the job side by side.
func TestJobSubmittedAgainWhileItsCopyDrains(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		running bool // the first copy runs on an old worker
	}{
		{"first copy waits", false},
		{"first copy runs on an old worker", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := drainConfig()
			f := newOlderFleet(t, cfg, "team-a")
			again := job.NewID()
			f.publishOld(t, "team-a", again)
			var held jetstream.Msg
			if tc.running {
				held = f.runOld(t, "team-a")
			}
			f.setUp(t)
			f.submit(t, "team-a", again)
			next := job.NewID()
			f.submit(t, "team-a", next)

			w := f.open(t, cfg, f.tenants, nil)
			want := map[string]int{again: 1, next: 1}
			if tc.running {
				want = map[string]int{next: 1}
			}
			var got []*queue.Delivery // held, unsettled, as running jobs are
			seen := map[string]int{}
			for slices.ContainsFunc(slices.Collect(maps.Keys(want)), func(id string) bool { return seen[id] == 0 }) {
				d := fetch(t, w, harness.Timeout(30*time.Second))
				got, seen[d.JobID] = append(got, d), seen[d.JobID]+1
			}
			if !maps.Equal(seen, want) {
				t.Errorf("the worker delivered %v; want %v (job %s once, from the shared stream)", seen, want, again)
			}
			s, err := f.js.Stream(t.Context(), queue.JobStream(cfg, "team-a"))
			if err != nil {
				t.Fatal(err)
			}
			subject := cfg.Subject + ".team-a." + again
			if info, err := s.Info(t.Context(), jetstream.WithSubjectFilter(subject)); err != nil || info.State.Subjects[subject] != 0 {
				t.Errorf("the tenant's stream still holds the second copy of %s (%v); want it dropped", again, err)
			}
			for _, d := range got {
				if err := d.Ack(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
			if held != nil {
				if err := held.DoubleAck(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
			f.waitDrained(t, w, "team-a")
		})
	}
}

// TestOldConsumersAckWaitIsItsOwn: the tenant's consumer on the shared stream and its consumer
// on the tenant's stream have one name. A job the old one delivered keeps that one's ack wait
// (which its heartbeats and lease checks follow), not the new one's: an older Boxcar allowed
// an ack wait below config.MinAckWait, and a heartbeat paced by the new consumer's, at most a
// second apart, came too late for it and had the job delivered again while it ran.
func TestOldConsumersAckWaitIsItsOwn(t *testing.T) {
	t.Parallel()
	cfg := drainConfig()
	f := newOlderFleet(t, cfg, "team-a")
	oldJob := job.NewID()
	f.publishOld(t, "team-a", oldJob)
	f.setUp(t)
	newJob := job.NewID()
	f.submit(t, "team-a", newJob)
	w := f.open(t, cfg, f.tenants, nil)
	for range 2 {
		d := fetch(t, w, harness.Timeout(30*time.Second))
		want := map[string]time.Duration{oldJob: oldAckWait, newJob: time.Hour}[d.JobID]
		if got := d.AckWait(); got != want {
			t.Errorf("job %s's ack wait is %s; want %s, its consumer's", d.JobID, got, want)
		}
		if err := d.Ack(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}
