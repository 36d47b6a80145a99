package queue_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestTenantsOwnQueueBound: a tenant's max_queued or max_queued_bytes bounds its job stream
// instead of nats.job_max_msgs or job_max_bytes. team-a, bounded to two jobs, is refused its
// third with an ErrFull that names its own setting; team-b, on the nats.job_* bound of three,
// takes its third and is refused its fourth naming nats.job_*. An operator's `nats stream
// edit` of team-a's bound is kept at the next declare, as for every other limit.
func TestTenantsOwnQueueBound(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", job.MaxMessageBytes-1024) // two fit in 2*MaxMessageBytes, three do not
	tests := []struct {
		name    string
		nats    func(*config.NATS)
		teamA   config.Tenant
		task    string
		setting string // team-a's; team-b's is the nats one
		natsKey string
		field   func(jetstream.StreamConfig) int64
		edit    func(*jetstream.StreamConfig)
	}{
		{
			name: "count", nats: func(n *config.NATS) { n.JobMaxMsgs = 3 },
			teamA: config.Tenant{Profiles: []string{"p"}, MaxQueued: 2}, task: "t",
			setting: "tenants.team-a.max_queued", natsKey: "nats.job_max_msgs",
			field: func(c jetstream.StreamConfig) int64 { return c.MaxMsgs },
			edit:  func(c *jetstream.StreamConfig) { c.MaxMsgs = 7 },
		},
		{
			name: "bytes", nats: func(n *config.NATS) { n.JobMaxBytes = 3 * job.MaxMessageBytes },
			teamA: config.Tenant{Profiles: []string{"p"}, MaxQueuedBytes: 2 * job.MaxMessageBytes}, task: big,
			setting: "tenants.team-a.max_queued_bytes", natsKey: "nats.job_max_bytes",
			field: func(c jetstream.StreamConfig) int64 { return c.MaxBytes },
			edit:  func(c *jetstream.StreamConfig) { c.MaxBytes = 7 * job.MaxMessageBytes },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tt.nats)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			tenants := map[string]config.Tenant{"team-a": tt.teamA, "team-b": {Profiles: []string{"p"}}}
			b.open(t, b.cfg, tenants, nil)
			for _, c := range []struct {
				tenant, setting string
				fits            int
			}{{"team-a", tt.setting, 2}, {"team-b", tt.natsKey, 3}} {
				client := b.client(t, c.tenant)
				for i := range c.fits {
					if _, err := client.Publish(ctx, job.Job{Version: job.Version, ID: job.NewID(), Profile: "p", Task: tt.task, SubmittedAt: time.Now().UTC()}); err != nil {
						t.Fatalf("%s's job %d of %d its queue takes: %v", c.tenant, i+1, c.fits, err)
					}
				}
				_, err := client.Publish(ctx, job.Job{Version: job.Version, ID: job.NewID(), Profile: "p", Task: tt.task, SubmittedAt: time.Now().UTC()})
				if !errors.Is(err, queue.ErrFull) || !strings.Contains(err.Error(), " "+c.setting+" ") {
					t.Errorf("%s's job past its bound: %v; want queue.ErrFull naming %s", c.tenant, err, c.setting)
				}
			}

			stream := queue.JobStream(b.cfg, "team-a")
			edit(t, b.js, stream, tt.edit)
			b.open(t, b.cfg, tenants, nil)
			want := streamConfig(t, b.js, stream)
			tt.edit(&want)
			if got := tt.field(streamConfig(t, b.js, stream)); got != tt.field(want) {
				t.Errorf("team-a's bound after an operator's edit and a worker start = %d, want the operator's %d", got, tt.field(want))
			}
		})
	}
}

// TestWorkerKeepsTheBoundOfATenantItDoesNotServe: a worker whose tenants: lacks team-a (a
// config that differs from the fleet's, which it warns of) still declares team-a's job stream,
// and leaves its bound, max_queued 2, as it is, rather than setting it back to
// nats.job_max_msgs: team-a is refused its third job, naming its own setting.
func TestWorkerKeepsTheBoundOfATenantItDoesNotServe(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	teamB := config.Tenant{Profiles: []string{"p"}}
	b.open(t, b.cfg, map[string]config.Tenant{"team-a": {Profiles: []string{"p"}, MaxQueued: 2}, "team-b": teamB}, nil)
	b.open(t, b.cfg, map[string]config.Tenant{"team-b": teamB}, nil)
	if got := streamConfig(t, b.js, queue.JobStream(b.cfg, "team-a")).MaxMsgs; got != 2 {
		t.Errorf("team-a's job stream holds at most %d jobs after a worker without team-a started; want its max_queued, 2", got)
	}
	a := b.client(t, "team-a")
	for range 2 {
		if _, err := a.Publish(ctx, newJob(t)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Publish(ctx, newJob(t)); !errors.Is(err, queue.ErrFull) || !strings.Contains(err.Error(), " tenants.team-a.max_queued ") {
		t.Errorf("team-a's third job: %v; want queue.ErrFull naming tenants.team-a.max_queued", err)
	}
}
