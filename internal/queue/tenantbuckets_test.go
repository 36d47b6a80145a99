package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestClientLearnsThereIsNoSharedStatusBucket: on a deployment that began with this version,
// which has no shared status bucket, a client that reads job after job its tenant's bucket
// does not hold (`submit status`, a listing, a watch) asks the shared bucket once, not once a
// job: a tenant's identity may not look it up, so it learns from the first direct get nobody
// answered, as a worker learns from its look-up at start. Before, every unknown id cost a
// direct get of the shared status bucket (32 requests for 8 jobs, not 25).
func TestClientLearnsThereIsNoSharedStatusBucket(t *testing.T) {
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
	// Each job: a get of the tenant's bucket, the count of its subject in the tenant's stream
	// and a direct get of it in the shared job stream (which setup keeps, for its metadata);
	// once: a direct get of the shared status bucket.
	if sent, most := nc.Stats().OutMsgs-before, uint64(3*jobs+1); sent > most {
		t.Errorf("the client sent %d requests for the statuses of %d unknown jobs, want at most %d", sent, jobs, most)
	}
}
