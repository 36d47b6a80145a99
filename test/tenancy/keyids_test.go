//go:build integration

package tenancy

import (
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
	"github.com/boxcar-run/boxcar/internal/natsconfig"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestStreamInfoNamesNoOtherTenantsJobs: team-b's worker and submitter write what each
// bucket and stream keeps of a team-b job (its status, a cancel request, an approval request,
// the day's spending, a dead letter) with Boxcar's own code on the layout `worker setup`
// makes; then team-a's submitter asks for the info, with a subject filter, of the shared
// stream that kept it before each tenant had its own, and of every stream of that name its
// permissions let it look up. The server cannot scope that request by its filter, so each
// answer must hold none of team-b's keys (its job ids, the days it spent): a refusal, or
// team-a's own stream.
func TestStreamInfoNamesNoOtherTenantsJobs(t *testing.T) {
	t.Parallel()
	d := deploy(t)
	cfg := setUp(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := d.connect(t, "worker")
	q, err := queue.NewConsumer(ctx, w.nc, cfg, twoTenants, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	idB := job.NewID()
	refB := queue.Ref{Tenant: "team-b", ID: idB}
	rows := []struct {
		name, stream string
		write        func(ctx context.Context) error
	}{
		{"status", "KV_" + cfg.StatusBucket, func(ctx context.Context) error {
			_, err := q.UpdateStatus(ctx, refB, func(st *job.Status) { st.State = job.StateRunning })
			return err
		}},
		{"approvals", "KV_" + cfg.ApprovalsBucket, func(ctx context.Context) error {
			now := time.Now().UTC()
			_, err := q.RequestApproval(ctx, queue.Approval{Tenant: "team-b", JobID: idB, CallID: "call-1", Argv: []string{"rm", "x"}, RequestedAt: now, ExpiresAt: now.Add(time.Hour)})
			return err
		}},
		// A cancel team-b asks while an upgrade runs: in its bucket, and in the shared one
		// (which the operator made as an older Boxcar did), where older workers watch.
		{"cancel", "KV_" + queue.CancelBucket, func(ctx context.Context) error {
			if _, err := d.connect(t, "operator").js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: queue.CancelBucket}); err != nil {
				return err
			}
			b, err := queue.NewClient(ctx, d.connect(t, "team-b-submitter").nc, cfg, "team-b")
			if err != nil {
				return err
			}
			_, err = b.Cancel(ctx, idB, "bob")
			return err
		}},
		// A day this version's worker counts for team-b, and one an older worker of an upgrade
		// counted in the shared bucket (which the operator made as an older Boxcar did).
		{"usage", "KV_" + queue.UsageBucket, func(ctx context.Context) error {
			if _, err := d.connect(t, "operator").js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: queue.UsageBucket}); err != nil {
				return err
			}
			if err := put(queue.UsageBucket, "team-b.2026-12-04", `{"tokens":7}`)(ctx, w); err != nil {
				return err
			}
			u, err := queue.OpenUsage(ctx, w.nc, []string{"team-a", "team-b"}, true)
			if err == nil {
				_, err = u.Add(ctx, "team-b", time.Now(), 5, 0)
			}
			return err
		}},
		// A team-b job this version's worker dead-letters, and one an older worker of an
		// upgrade did, in the shared stream.
		{"dead letters", cfg.DeadLetterStream, func(ctx context.Context) error {
			if _, err := w.js.Publish(ctx, cfg.DeadLetterStream+".team-b."+idB, []byte(`{"reason":"exhausted"}`)); err != nil {
				return err
			}
			return deadLetterAJob(ctx, d.connect(t, "team-b-submitter"), q, cfg, "team-b")
		}},
	}
	granted := natsconfig.PermissionsOf(d.names, natsconfig.Identity{Role: natsconfig.Submitter, Tenant: "team-a"}, tenants, "").Pub
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			if err := row.write(ctx); err != nil {
				t.Fatalf("team-b's %s: %v", row.name, err)
			}
			for _, stream := range lookUps(row.stream, granted) {
				// A subject names team-b (its stream, its keys) or, in a stream of its own, team-b's job.
				if subjects := streamSubjects(ctx, t, d, stream); slices.ContainsFunc(subjects, func(s string) bool { return strings.Contains(s, "team-b") || strings.Contains(s, idB) }) {
					t.Errorf("team-a's submitter lists team-b's keys (job %s) in %s: %v", idB, stream, subjects)
				}
			}
		})
	}
}

// lookUps is the shared stream and every stream named after it that the permissions let the
// identity look up.
func lookUps(shared string, granted []string) []string {
	out := []string{shared}
	for _, s := range granted {
		if name, ok := strings.CutPrefix(s, "$JS.API.STREAM.INFO."); ok && strings.HasPrefix(name, shared) && name != shared {
			out = append(out, name)
		}
	}
	return out
}

// streamSubjects is what team-a's submitter learns of a stream's subjects by its info with a
// subject filter of every subject; nil when the server refuses it the request.
func streamSubjects(ctx context.Context, t *testing.T, d *deployment, stream string) []string {
	t.Helper()
	c := d.connect(t, "team-a-submitter") // its own: a refusal ends what waits on the connection
	var answer []byte
	err := c.try(ctx, func(ctx context.Context, c *conn) error {
		m, err := c.nc.RequestWithContext(ctx, "$JS.API.STREAM.INFO."+stream, []byte(`{"subjects_filter":">"}`))
		if err == nil {
			answer = m.Data
		}
		return err
	})
	if err != nil {
		if refused, _ := c.refused(ctx, err); refused {
			return nil
		}
		t.Fatalf("look up %s: %v", stream, err)
	}
	var info struct {
		State struct {
			Subjects map[string]uint64 `json:"subjects"`
		} `json:"state"`
	}
	if err := json.Unmarshal(answer, &info); err != nil {
		t.Fatalf("the info of %s: %v", stream, err)
	}
	var out []string
	for s := range info.State.Subjects {
		out = append(out, s)
	}
	return out
}

// deadLetterAJob submits a job of tenant as its submitter c and has worker q dead-letter it
// (Term, as a job that can never run).
func deadLetterAJob(ctx context.Context, c *conn, q *queue.Consumer, cfg config.NATS, tenant string) error {
	sub, err := queue.NewClient(ctx, c.nc, cfg, tenant)
	if err != nil {
		return err
	}
	j := job.Job{Version: job.Version, ID: job.NewID(), Profile: "p", Task: "never runs", SubmittedAt: time.Now().UTC()}
	if _, err := sub.Publish(ctx, j); err != nil {
		return err
	}
	fetch, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	del, err := q.Fetch(fetch)
	if err != nil {
		return err
	}
	if del.Tenant != tenant || del.JobID != j.ID {
		return fmt.Errorf("delivered %s/%s, want %s/%s", del.Tenant, del.JobID, tenant, j.ID)
	}
	_, err = del.Term(ctx, "invalid_message", errors.New("never runs"))
	return err
}
