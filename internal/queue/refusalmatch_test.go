package queue_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestARefusalIsOfItsSubjectWhole holds that a request reads as refused only for a refusal of
// its own subject, or of one under its tokens where it names them with ".>": a refusal shows
// on the connection alone, and another request on it, refused a subject its own is a prefix
// of (another tenant's stream, bucket or key), is not its refusal.
func TestARefusalIsOfItsSubjectWhole(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, refused string
		ours          []string
		want          bool
	}{
		{"tenant's stream, another tenant's refused", "$JS.API.STREAM.INFO.BOXCAR_JOBS_team-b", []string{"$JS.API.STREAM.INFO.BOXCAR_JOBS_team"}, false},
		{"shared stream, a tenant's refused", "$JS.API.STREAM.INFO.BOXCAR_JOBS_team", []string{"$JS.API.STREAM.INFO.BOXCAR_JOBS"}, false},
		{"consumer, a longer name refused", "$JS.API.CONSUMER.INFO.BOXCAR_JOBS.boxcar-team-b", []string{"$JS.API.CONSUMER.INFO.BOXCAR_JOBS.boxcar-team"}, false},
		{"bucket's keys, another bucket's key refused", "$KV.cancel_team-b.k", []string{"$KV.cancel_team.>"}, false},
		{"direct get, another stream's refused", "$JS.API.DIRECT.GET.KV_cancel_team-b.$KV.cancel_team-b.k", []string{"$JS.API.DIRECT.GET.KV_cancel_team.>"}, false},
		{"job subject, a longer id refused", "boxcar.jobs.team.j12", []string{"boxcar.jobs.team.j1"}, false},
		{"its own subject refused", "$JS.API.STREAM.INFO.BOXCAR_JOBS_team", []string{"$JS.API.STREAM.INFO.BOXCAR_JOBS_team"}, true},
		{"a key under its tokens refused", "$KV.cancel_team.k", []string{"$KV.cancel_team.>"}, true},
		{"one of its subjects refused", "$JS.API.STREAM.CREATE.BOXCAR_JOBS_team", []string{"$JS.API.STREAM.LIST", "$JS.API.STREAM.CREATE.>"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			nc := serverDenyingWorker(t, tc.refused)("worker")
			err := queue.UnlessRefused(t.Context(), nc, tc.ours, func(ctx context.Context) error {
				// The other request on the connection, refused while ours waits for its answer.
				if err := nc.Publish(tc.refused, nil); err != nil {
					return err
				}
				for !errors.Is(nc.LastError(), nats.ErrPermissionViolation) || !strings.Contains(nc.LastError().Error(), tc.refused) {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(10 * time.Millisecond):
					}
				}
				// An answer slow to come, long past the refusal.
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Second):
					return nil
				}
			})
			if got := errors.Is(err, queue.ErrRefused); got != tc.want || !got && err != nil {
				t.Fatalf("refused %s, ours %v: err = %v, want refused %v", tc.refused, tc.ours, err, tc.want)
			}
		})
	}
}
