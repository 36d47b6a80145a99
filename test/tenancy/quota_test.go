//go:build integration

package tenancy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestTenantCannotFillTheStoreThroughABucket: team-a's submitter may write cancel requests of
// any id of its tenant, with no expiry (Nats-TTL: never, as Cancel writes them), and its
// approver answers under any key of its tenant, kept 7 days; the server's store holds every
// tenant's jobs and statuses. Their raw writes, one large or many small, are refused past the
// bucket's bounds, which hold.
func TestTenantCannotFillTheStoreThroughABucket(t *testing.T) {
	t.Parallel()
	const bound = 64 << 10
	cancels := func(n *config.NATS) { n.CancelMaxBytes = bound }
	approvals := func(n *config.NATS) { n.ApprovalsMaxBytes = bound }
	tests := []struct {
		name, who, bucket, key string
		set                    func(*config.NATS)
		ttl                    string // the writes' Nats-TTL header, if any
		size, most             int    // of each write; writes at most
	}{
		{name: "one cancel request of 512 KiB", who: "team-a-submitter", bucket: queue.CancelBucketOf("team-a"), key: "team-a.%s",
			set: cancels, ttl: "never", size: 512 << 10, most: 1},
		{name: "cancel requests of 1 KiB past nats.cancel_max_bytes", who: "team-a-submitter", bucket: queue.CancelBucketOf("team-a"), key: "team-a.%s",
			set: cancels, ttl: "never", size: 1 << 10, most: 4 * bound / (1 << 10)},
		{name: "one approval answer of 1000 KiB", who: "team-a-approver", bucket: "BOXCAR_APPROVALS_team-a", key: "team-a.%s.call_1",
			set: approvals, size: 1000 << 10, most: 1},
		{name: "approval answers of 1 KiB past nats.approvals_max_bytes", who: "team-a-approver", bucket: "BOXCAR_APPROVALS_team-a", key: "team-a.%s.call_1",
			set: approvals, size: 1 << 10, most: 4 * bound / (1 << 10)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d, _, ctx := deployWith(t, tt.set)
			mallory := d.connect(t, tt.who)
			stored := 0
			for ; stored < tt.most; stored++ {
				m := nats.NewMsg("$KV." + tt.bucket + "." + fmt.Sprintf(tt.key, job.NewID()))
				if tt.ttl != "" {
					m.Header.Set("Nats-TTL", tt.ttl)
				}
				m.Data = []byte(strings.Repeat("x", tt.size))
				if _, err := mallory.js.PublishMsg(ctx, m); err != nil {
					t.Logf("%s's write %d refused: %v", tt.who, stored+1, err)
					break
				}
			}
			if stored == tt.most {
				t.Errorf("%s stored all its %d writes of %d bytes; want the bucket to refuse past %d bytes", tt.who, stored, tt.size, bound)
			}
			s, err := d.connect(t, "operator").js.Stream(ctx, "KV_"+tt.bucket)
			if err != nil {
				t.Fatal(err)
			}
			if b := s.CachedInfo().State.Bytes; b > bound {
				t.Errorf("the bucket %s holds %d bytes; want at most its bound, %d", tt.bucket, b, bound)
			}
		})
	}
}

// TestRefusedAtALimitSaysWhich: a submission or cancel refused at a limit of the job stream or
// the cancel bucket is ErrFull and names the setting that sets the limit, which `submit` prints.
func TestRefusedAtALimitSaysWhich(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		set  func(*config.NATS)
		task string // of each job
		// cancel: fill the cancel bucket with raw requests, then cancel a queued job.
		cancel bool
		want   string
	}{
		{name: "job stream by count", set: func(n *config.NATS) { n.JobMaxMsgs = 4 }, task: "small", want: "nats.job_max_msgs"},
		{name: "job stream by size", set: func(n *config.NATS) { n.JobMaxBytes = 4 * job.MaxMessageBytes },
			task: strings.Repeat("x", job.MaxMessageBytes-1024), want: "nats.job_max_bytes"},
		{name: "cancel bucket", set: func(n *config.NATS) { n.CancelMaxBytes = 16 << 10 }, task: "small", cancel: true, want: "nats.cancel_max_bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d, cfg, ctx := deployWith(t, tt.set)
			sub := d.connect(t, "team-a-submitter")
			a, err := queue.NewClient(ctx, sub.nc, cfg, "team-a")
			if err != nil {
				t.Fatal(err)
			}
			err = fill(ctx, a, sub, tt.task, tt.cancel)
			t.Logf("refused: %v", err)
			if !errors.Is(err, queue.ErrFull) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("refused: %v; want queue.ErrFull naming %s", err, tt.want)
			}
		})
	}
}

// deployWith deploys, sets the layout up as `worker setup` does with the defaults that set
// changes, and returns the config and a context that ends with the test (two minutes at most).
func deployWith(t *testing.T, set func(*config.NATS)) (*deployment, config.NATS, context.Context) {
	t.Helper()
	d := deploy(t)
	cfg := config.Config{}.WithDefaults().NATS
	set(&cfg)
	cfg = setUpWith(t, d, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return d, cfg, ctx
}

// TestTenantCannotFillTheJobStreamForAnother: the job stream's bounds (nats.job_max_msgs,
// nats.job_max_bytes) are each tenant's. team-a fills its queue until the server refuses its
// next job; team-b's submission is still queued, and a worker (worker.creds) of team-b fetches
// it and runs it to its ack. With one stream for every tenant, team-a's queued jobs made
// team-b's submissions fail (queue.ErrFull) until they ended.
func TestTenantCannotFillTheJobStreamForAnother(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		set  func(*config.NATS)
		task string // of each of team-a's jobs
	}{
		{name: "by count", set: func(n *config.NATS) { n.JobMaxMsgs = 4 }, task: "small"},
		{name: "by size", set: func(n *config.NATS) { n.JobMaxBytes = 4 * job.MaxMessageBytes }, task: strings.Repeat("x", job.MaxMessageBytes-1024)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d, cfg, ctx := deployWith(t, tt.set)
			subA := d.connect(t, "team-a-submitter")
			a, err := queue.NewClient(ctx, subA.nc, cfg, "team-a")
			if err != nil {
				t.Fatal(err)
			}
			if err := fill(ctx, a, subA, tt.task, false); !errors.Is(err, queue.ErrFull) {
				t.Fatalf("team-a fills its queue: %v; want queue.ErrFull", err)
			}
			b, err := queue.NewClient(ctx, d.connect(t, "team-b-submitter").nc, cfg, "team-b")
			if err != nil {
				t.Fatal(err)
			}
			victim := job.Job{Version: job.Version, ID: job.NewID(), Profile: "p", Task: tt.task, SubmittedAt: time.Now().UTC()} // as large as team-a's
			if _, err := b.Publish(ctx, victim); err != nil {
				t.Fatalf("team-b submits while team-a's queue is full: %v; want it queued", err)
			}
			w, err := queue.NewConsumer(ctx, d.connect(t, "worker").nc, cfg, map[string]config.Tenant{"team-b": twoTenants["team-b"]},
				slog.New(slog.DiscardHandler), nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := w.Fetch(ctx)
			if err != nil {
				t.Fatalf("team-b's worker fetches: %v", err)
			}
			if got.Tenant != "team-b" || got.JobID != victim.ID {
				t.Fatalf("team-b's worker got %s's job %s; want team-b's %s", got.Tenant, got.JobID, victim.ID)
			}
			if err := got.Ack(ctx); err != nil {
				t.Fatalf("ack team-b's job: %v", err)
			}
		})
	}
}

// fill submits jobs of task until one is refused, or with cancels one job and then fills the
// cancel bucket with raw requests before cancelling it; it returns the refusal.
func fill(ctx context.Context, a *queue.Client, sub *conn, task string, cancels bool) error {
	for range 1000 {
		j := job.Job{Version: job.Version, ID: job.NewID(), Profile: "p", Task: task, SubmittedAt: time.Now().UTC()}
		if _, err := a.Publish(ctx, j); err != nil || !cancels {
			if err != nil {
				return err
			}
			continue
		}
		// Requests of 1 KiB until one is refused, then of a byte, to fill what is left.
		for _, size := range []int{1 << 10, 1} {
			for range 1000 {
				m := nats.NewMsg("$KV." + queue.CancelBucketOf("team-a") + ".team-a." + job.NewID())
				m.Data = []byte(strings.Repeat("x", size))
				if _, err := sub.js.PublishMsg(ctx, m); err != nil {
					break
				}
			}
		}
		_, err := a.Cancel(ctx, j.ID, "tester@test")
		return err
	}
	return errors.New("nothing refused")
}
