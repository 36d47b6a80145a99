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
	c, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer+"-default")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config.MaxDeliver; got != -1 {
		t.Errorf("after a worker start the tenant's consumer's max_deliver = %d, want -1 (unbounded)", got)
	}
	// The stream holds one message per job subject now, and no longer takes the bare subject,
	// whose jobs were moved to tenant default's subjects.
	s, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if sc := s.CachedInfo().Config; sc.MaxMsgsPerSubject != 1 || !sc.DiscardNewPerSubject || sc.Discard != jetstream.DiscardNew || !reflect.DeepEqual(sc.Subjects, []string{cfg.Subject + ".default.*"}) {
		t.Errorf("after a worker start the job stream has max_msgs_per_subject %d, discard_new_per_subject %v, discard %v, subjects %v; want 1, true, new, [%s.default.*]",
			sc.MaxMsgsPerSubject, sc.DiscardNewPerSubject, sc.Discard, sc.Subjects, cfg.Subject)
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
