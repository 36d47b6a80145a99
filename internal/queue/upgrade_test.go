package queue_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestConsumerOfAnOlderBoxcar: a worker that starts on the one consumer an older Boxcar shared
// between all jobs (before tenants), with a finite max_deliver the server used to drop jobs
// silently, removes it, says so, and its tenant's consumer delivers every job left in the
// stream, on the old subject too, moved to tenant default's subjects under the id of their
// Nats-Msg-Id: the one the old setting had dropped and the one waiting.
func TestConsumerOfAnOlderBoxcar(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := config.Config{}.WithDefaults().NATS
	cfg.AckWait = config.Duration(time.Second)
	cfg.MaxDeliver = 2
	// The stream and consumer as such a worker made them.
	b, stream := olderSetup(t, cfg, func(c *jetstream.StreamConfig) { c.MaxMsgs, c.MaxBytes = -1, -1 })
	nc, js := b.nc, b.js
	old, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: cfg.Consumer, Description: "Boxcar workers",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second, MaxDeliver: cfg.MaxDeliver})
	if err != nil {
		t.Fatal(err)
	}
	publish := func() job.Job {
		j := job.Job{Version: job.Version, ID: job.NewID(), Profile: "p", Task: "t", SubmittedAt: time.Now().UTC()}
		data, err := j.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, cfg.Subject, data, jetstream.WithMsgID(j.ID)); err != nil {
			t.Fatal(err)
		}
		return j
	}
	// One job's two deliveries die; the server then drops it, though it stays in the stream.
	dropped := publish()
	for i := range 2 {
		m, err := old.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("delivery %d of the old consumer: %v", i+1, err)
		}
		if id := m.Headers().Get(jetstream.MsgIDHeader); id != dropped.ID {
			t.Fatalf("delivery of %s, want %s", id, dropped.ID)
		}
	}
	// The server drops it when it would deliver it again, to a pull that waits.
	harness.Wait(t, "the old consumer to drop the job", func() (bool, error) {
		if m, err := old.Next(jetstream.FetchMaxWait(time.Second)); err == nil {
			t.Fatalf("the old consumer delivered %s again, past its max_deliver", m.Headers().Get(jetstream.MsgIDHeader))
		}
		info, err := old.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Past its last AckWait: dropped, never delivered again.
		return info.NumAckPending == 0 && info.NumPending == 0, fmt.Errorf("%d in flight, %d pending", info.NumAckPending, info.NumPending)
	})
	waiting := publish() // not delivered yet

	var log bytes.Buffer
	q, err := queue.Open(ctx, nc, cfg, nil, slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("after a worker start the shared consumer is still there: %v", err)
	}
	c, err := js.Consumer(ctx, queue.JobStream(cfg, "default"), cfg.Consumer+"-default")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config.MaxDeliver; got != -1 {
		t.Errorf("after a worker start the tenant's consumer's max_deliver = %d, want -1 (unbounded)", got)
	}
	// The tenant's stream holds one message per job subject; the shared one takes no job,
	// neither on the bare subject, whose jobs were moved to tenant default's subjects, nor on
	// those, whose jobs, which no consumer delivered, were moved to the tenant's stream.
	s, err := js.Stream(ctx, queue.JobStream(cfg, "default"))
	if err != nil {
		t.Fatal(err)
	}
	if sc := s.CachedInfo().Config; sc.MaxMsgsPerSubject != 1 || !sc.DiscardNewPerSubject || sc.Discard != jetstream.DiscardNew || !reflect.DeepEqual(sc.Subjects, []string{cfg.Subject + ".default.*"}) {
		t.Errorf("after a worker start the job stream has max_msgs_per_subject %d, discard_new_per_subject %v, discard %v, subjects %v; want 1, true, new, [%s.default.*]",
			sc.MaxMsgsPerSubject, sc.DiscardNewPerSubject, sc.Discard, sc.Subjects, cfg.Subject)
	}
	if s, err := js.Stream(ctx, cfg.Stream); err != nil || !reflect.DeepEqual(s.CachedInfo().Config.Subjects, []string{cfg.Subject + "._shared"}) || s.CachedInfo().State.Msgs != 0 {
		t.Errorf("after a worker start the shared stream (err %v) takes a job's subject or holds a job; want neither", err)
	}
	for _, want := range []string{"removed the consumer all tenants shared", "old_max_deliver=2", "moved the jobs left on the subject of submitters before tenants", "jobs=2"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("worker log does not say %q:\n%s", want, log.String())
		}
	}
	got := map[string]int{}
	for range 2 {
		d := fetch(t, q, 10*time.Second)
		got[d.JobID] = d.Attempt
		if d.Tenant != "default" {
			t.Errorf("a job on the old subject is of tenant %q, want default", d.Tenant)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := got[dropped.ID]; !ok {
		t.Errorf("the job the old max_deliver dropped was not delivered again; got %v", got)
	}
	if _, ok := got[waiting.ID]; !ok {
		t.Errorf("the waiting job was not delivered; got %v", got)
	}

	// The next start finds the consumer as it wants it and resets nothing.
	log.Reset()
	if _, err := queue.Open(ctx, nc, cfg, nil, slog.New(slog.NewTextHandler(&log, nil))); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(log.String(), "shared") {
		t.Errorf("a second start touched the consumer again:\n%s", log.String())
	}
	expectEmpty(t, q, 2*time.Second)
}

// TestSharedJobStreamDrainsIntoTenantStreams: an older Boxcar queued every tenant's jobs in
// one stream, whose limits were every tenant's together; one of them runs on a worker of that
// version. `worker setup` of this one makes each tenant's stream (which the server allows
// only once the shared stream takes their subjects no more), and a new submission lands in
// its tenant's stream; one sent as an older submit sends it (expecting the shared stream) is
// refused, not lost. A worker of this version delivers every job the shared stream held and
// each new one once, never the one the old worker runs; once that one is acked the worker
// removes its tenant's consumer on the shared stream, which holds no job then.
func TestSharedJobStreamDrainsIntoTenantStreams(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg := config.Config{}.WithDefaults().NATS
	cfg.AckWait = config.Duration(time.Minute) // the old worker's job is not delivered again meanwhile
	both := map[string]config.Tenant{"team-a": {}, "team-b": {}}
	b, shared := olderSetup(t, cfg, func(c *jetstream.StreamConfig) {
		c.Subjects = []string{cfg.Subject + ".team-a.*", cfg.Subject + ".team-b.*"}
		c.MaxMsgsPerSubject, c.DiscardNewPerSubject, c.Discard = 1, true, jetstream.DiscardNew
		c.RePublish = &jetstream.RePublish{Source: cfg.Subject + ".>", Destination: cfg.Subject + "-queued.>", HeadersOnly: true}
	})
	old := map[string]jetstream.Consumer{}
	for tenant := range both {
		c, err := shared.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: cfg.Consumer + "-" + tenant, FilterSubjects: []string{cfg.Subject + "." + tenant + ".*"},
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute, MaxDeliver: -1})
		if err != nil {
			t.Fatal(err)
		}
		old[tenant] = c
	}
	publish := func(tenant string) string {
		id := job.NewID()
		data, err := job.Job{Version: job.Version, ID: id, Profile: "p", Task: "t", SubmittedAt: time.Now().UTC()}.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.js.Publish(ctx, cfg.Subject+"."+tenant+"."+id, data, jetstream.WithExpectStream(cfg.Stream)); err != nil {
			t.Fatalf("publish %s's job as an older submit: %v", tenant, err)
		}
		return id
	}
	running := publish("team-a")
	held, err := old["team-a"].Next(jetstream.FetchMaxWait(10 * time.Second)) // an old worker runs it
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{publish("team-a"): true, publish("team-a"): true, publish("team-b"): true}

	admin, err := queue.NewAdmin(b.nc, cfg, both, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Declare(ctx); err != nil {
		t.Fatalf("worker setup on the shared stream of an older Boxcar: %v", err)
	}
	for tenant := range both {
		s, err := b.js.Stream(ctx, queue.JobStream(cfg, tenant))
		if err != nil {
			t.Fatalf("after setup, %s's stream: %v", tenant, err)
		}
		if got, wantSubjects := s.CachedInfo().Config.Subjects, []string{cfg.Subject + "." + tenant + ".*"}; !reflect.DeepEqual(got, wantSubjects) {
			t.Errorf("%s's stream takes %v; want %v", tenant, got, wantSubjects)
		}
	}
	if _, err := b.js.Publish(ctx, cfg.Subject+".team-a."+job.NewID(), []byte("{}"), jetstream.WithExpectStream(cfg.Stream)); err == nil {
		t.Error("a job published as an older submit does (expecting the shared stream) was stored; want it refused, so that submit says it failed")
	}
	a, err := queue.NewClient(ctx, b.nc, cfg, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	fresh := job.Job{Version: job.Version, ID: job.NewID(), Profile: "p", Task: "t", SubmittedAt: time.Now().UTC()}
	if _, err := a.Publish(ctx, fresh); err != nil {
		t.Fatalf("submit after setup: %v", err)
	}
	want[fresh.ID] = true

	w, err := queue.Open(ctx, b.nc, cfg, both, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for range len(want) {
		d := fetch(t, w, 30*time.Second)
		got[d.JobID]++
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for id := range want {
		if got[id] != 1 {
			t.Errorf("job %s delivered %d times; want once (got %v)", id, got[id], got)
		}
	}
	if got[running] != 0 {
		t.Errorf("the job an old worker runs was delivered to the new worker too")
	}
	expectEmpty(t, w, 2*time.Second)
	if err := held.DoubleAck(ctx); err != nil {
		t.Fatalf("the old worker acks its job: %v", err)
	}
	harness.Wait(t, "the worker to remove team-a's consumer on the drained shared stream", func() (bool, error) {
		expectEmpty(t, w, time.Second)
		_, err := b.js.Consumer(ctx, cfg.Stream, cfg.Consumer+"-team-a")
		return errors.Is(err, jetstream.ErrConsumerNotFound), err
	})
	s, err := b.js.Stream(ctx, cfg.Stream)
	if err != nil {
		t.Fatalf("the shared stream, which records retired tenants, is gone: %v", err)
	}
	if info := s.CachedInfo(); info.State.Msgs != 0 || !reflect.DeepEqual(info.Config.Subjects, []string{cfg.Subject + "._shared"}) {
		t.Errorf("the shared stream holds %d messages and takes %v; want none, and no tenant's subject", info.State.Msgs, info.Config.Subjects)
	}
}
