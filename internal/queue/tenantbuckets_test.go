package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestClientAsksNoSharedStatusBucketInFewRequests: on a deployment that began with this
// version, which has no shared status bucket, a client that reads job after job its tenant's
// bucket does not hold (`submit status`, a listing, a watch) sends a fixed few requests a job:
// the direct get of the shared bucket, which nobody answers at once, is one of them. A tenant's
// identity may not look the bucket up, so it cannot tell none from one electing its leader,
// and it remembers neither (TestSubmitterReadsASharedBucketAgainOnceItAnswers).
func TestClientAsksNoSharedStatusBucketInFewRequests(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	nc, err := queue.Connect(ctx, queue.ConnOptions{URL: b.nc.ConnectedUrl(), Name: "client"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c := queueClient(ctx, t, nc, b.cfg, tenant)
	const jobs = 8
	before := nc.Stats().OutMsgs
	for range jobs {
		if _, err := c.Status(ctx, job.NewID()); !errors.Is(err, queue.ErrUnknownJob) {
			t.Fatalf("status of a job never submitted: %v, want unknown", err)
		}
	}
	// Each job: a get of the tenant's bucket, a direct get of the shared status bucket, the
	// count of its subject in the tenant's stream and a direct get of it in the shared job
	// stream (which setup keeps, for its metadata).
	if sent, most := nc.Stats().OutMsgs-before, uint64(4*jobs); sent > most {
		t.Errorf("the client sent %d requests for the statuses of %d unknown jobs, want at most %d", sent, jobs, most)
	}
}
