package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestCancelOfAnUpgradeIsSeenByEitherVersion: each tenant asks its cancels in a bucket of its
// own (queue.CancelBucketOf), and during an upgrade older submitters ask, and older workers
// watch, in the shared one an older Boxcar made. A request an older submit wrote there is
// seen by this version's worker (its watch, CancelAsked, the status); one this version's
// submit asks is written into both buckets, so an older worker's watch sees it too; and a
// release lets both expire.
func TestCancelOfAnUpgradeIsSeenByEitherVersion(t *testing.T) {
	t.Parallel()
	u := newUpgrade(t, false)
	js, ctx := u.js, u.ctx
	shared := u.olderBucket(t, queue.CancelBucket, 1)
	b := start(t, u.nc, u.cfg)
	w, c := b.w, b.c
	older, newer := newJob(t), newJob(t)
	for _, j := range []job.Job{older, newer} {
		if _, err := c.Publish(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := shared.Create(ctx, tenant+"."+older.ID, mustMarshal(t, queue.CancelRequest{At: time.Now().UTC(), By: "older submit"})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cancel(ctx, newer.ID, "ann"); err != nil {
		t.Fatal(err)
	}
	mine, err := js.KeyValue(ctx, queue.CancelBucketOf(tenant))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range []jetstream.KeyValue{mine, shared} {
		if _, err := kv.Get(ctx, tenant+"."+newer.ID); err != nil {
			t.Errorf("this version's cancel is not in %s, where a worker watches: %v", kv.Bucket(), err)
		}
	}
	for _, id := range []string{older.ID, newer.ID} {
		if asked, err := w.CancelAsked(ctx, ref(id)); err != nil || !asked {
			t.Errorf("CancelAsked(%s) = %t, %v; want asked", id, asked, err)
		}
		if st, err := c.Status(ctx, id); err != nil || !st.CancelRequested {
			t.Errorf("the status of %s says cancel requested %t, %v; want requested", id, st.CancelRequested, err)
		}
	}
	if got := watchedCancels(ctx, t, w); !slices.Contains(got, older.ID) || !slices.Contains(got, newer.ID) {
		t.Errorf("this version's worker's watch read %v, want both %s (older submit's) and %s", got, older.ID, newer.ID)
	}
	if err := w.ReleaseCancel(ctx, ref(newer.ID)); err != nil {
		t.Fatal(err)
	}
	for _, kv := range []jetstream.KeyValue{mine, shared} {
		var req queue.CancelRequest
		e, err := kv.Get(ctx, tenant+"."+newer.ID)
		if err == nil {
			err = json.Unmarshal(e.Value(), &req)
		}
		if err != nil || !req.Released {
			t.Errorf("the released request in %s: %+v, %v; want released", kv.Bucket(), req, err)
		}
	}
}

// watchedCancels is what the worker's watch of the tests' tenant reads until it is up to date.
func watchedCancels(ctx context.Context, t *testing.T, w *queue.Consumer) []string {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	updates, err := w.WatchCancels(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for u := range updates {
		if u.Ref.ID != "" {
			ids = append(ids, u.Ref.ID)
		}
		if u.Ref.ID == "" && !u.Behind {
			return ids
		}
	}
	t.Fatalf("the watch ended before it was up to date, having read %v", ids)
	return nil
}

// TestCancelAskedTwiceInAnOlderSharedBucket: the shared cancel bucket an earlier Boxcar made
// allows no TTL per request (`worker setup` of this version has not updated it): the request
// goes there all the same, expiring with the bucket, and a cancel asked twice is no error (the
// server checks the key holds none before it looks at the TTL).
func TestCancelAskedTwiceInAnOlderSharedBucket(t *testing.T) {
	t.Parallel()
	u := newUpgrade(t, false)
	b := start(t, u.nc, u.cfg)
	shared := u.olderBucket(t, queue.CancelBucket, 1) // after the start: as it was made, no TTL per request
	j := b.submit(t)
	for i := range 2 {
		if st, err := b.c.Cancel(u.ctx, j.ID, "ann"); err != nil || !st.CancelRequested {
			t.Fatalf("cancel %d: %+v, %v; want requested", i+1, st, err)
		}
	}
	if _, err := shared.Get(u.ctx, tenant+"."+j.ID); err != nil {
		t.Errorf("the request is not in the shared bucket, where older workers watch: %v", err)
	}
}

// TestCancelPastAFullSharedBucketSaysWhereItIsAsked: during an upgrade the shared cancel
// bucket is still one for every tenant, and another tenant's requests can fill it. A cancel
// of this version is asked in its tenant's bucket all the same, where this version's workers
// watch, and its error says so and names the shared bucket as the one that refused it: it
// said only that the shared bucket was full and to try again later, of a cancel already
// asked, which asking again could not change.
func TestCancelPastAFullSharedBucketSaysWhereItIsAsked(t *testing.T) {
	t.Parallel()
	u := newUpgrade(t, false)
	u.olderBucket(t, queue.CancelBucket, 1)
	b := start(t, u.nc, u.cfg)
	name := "KV_" + queue.CancelBucket
	cfg := streamConfig(t, u.js, name)
	cfg.MaxBytes = 4096
	if _, err := u.js.UpdateStream(u.ctx, cfg); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ { // another tenant's requests, until the shared bucket takes no more
		if _, err := u.js.Publish(u.ctx, "$KV."+queue.CancelBucket+".other."+newJob(t).ID, []byte(`{"by":"other"}`)); err != nil {
			break
		}
		if i == 1000 {
			t.Fatal("the shared bucket of 4096 bytes took 1000 requests")
		}
	}
	j := b.submit(t)
	_, err := b.c.Cancel(u.ctx, j.ID, "ann")
	if !errors.Is(err, queue.ErrFull) || !strings.Contains(err.Error(), "asked in "+queue.CancelBucketOf(tenant)) ||
		!strings.Contains(err.Error(), "not in the shared "+queue.CancelBucket) {
		t.Errorf("Cancel: %v; want ErrFull saying it is asked in %s and not in the shared %s", err, queue.CancelBucketOf(tenant), queue.CancelBucket)
	}
	mine, err := u.js.KeyValue(u.ctx, queue.CancelBucketOf(tenant))
	if err == nil {
		_, err = mine.Get(u.ctx, tenant+"."+j.ID)
	}
	if err != nil {
		t.Errorf("the request is not in %s, where this version's workers watch: %v", queue.CancelBucketOf(tenant), err)
	}
}

// TestCancelTheSharedBucketMissedReachesOlderWorkers: during an upgrade a submitter writes a
// cancel into its tenant's bucket and the shared one older workers watch. When the shared
// bucket's stream answers nobody at that moment (its leader being elected) the submitter,
// which may not ask the stream's info, takes it as gone and writes the tenant's bucket alone:
// an older worker running the job never saw the request. A worker of this version watches the
// tenant's bucket and may write the shared one: it copies the request there once the stream
// answers again, and an older worker's watch (a stand-in, watching the shared bucket alone)
// sees it.
func TestCancelTheSharedBucketMissedReachesOlderWorkers(t *testing.T) {
	t.Parallel()
	u := newUpgrade(t, false)
	shared := u.olderBucket(t, queue.CancelBucket, 1)
	b := start(t, u.nc, u.cfg)
	j := b.submit(t)
	ctx, stop := context.WithCancel(u.ctx)
	defer stop()
	updates, err := b.w.WatchCancels(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	name := "KV_" + queue.CancelBucket
	cfg := streamConfig(t, u.js, name)
	away := cfg
	away.Subjects = []string{name + "-away.>"} // a publish there is answered by nobody, as during an election
	if _, err := u.js.UpdateStream(ctx, away); err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.Cancel(ctx, j.ID, "ann"); err != nil {
		t.Fatal(err)
	}
	for up := range updates { // this version's worker read the request in the tenant's bucket
		if up.Ref.ID == j.ID {
			break
		}
	}
	go func() {
		for range updates {
		}
	}()
	if _, err := u.js.UpdateStream(ctx, cfg); err != nil { // the stream answers again
		t.Fatal(err)
	}
	older, err := shared.Watch(ctx, tenant+".*")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = older.Stop() }()
	within := time.After(harness.Timeout(20 * time.Second))
	for {
		select {
		case e := <-older.Updates():
			if e != nil && e.Key() == tenant+"."+j.ID {
				return
			}
		case <-within:
			t.Fatalf("an older worker watching %s never saw the cancel of %s, asked while the bucket answered nobody", queue.CancelBucket, j.ID)
		}
	}
}

// TestCancelAskedWaitsForASharedBucketThatAnswersNobody: a worker asks whether a cancel was
// asked for a job that waited longer than status_ttl (its cancelled status may have expired);
// during an upgrade an older submit asked in the shared bucket. When that bucket's stream
// answered nobody at that moment the worker took it as holding no request, and ran the job.
// It now says it cannot tell (the worker asks again) while the stream is there.
func TestCancelAskedWaitsForASharedBucketThatAnswersNobody(t *testing.T) {
	t.Parallel()
	u := newUpgrade(t, false)
	shared := u.olderBucket(t, queue.CancelBucket, 1)
	b := start(t, u.nc, u.cfg)
	j := b.submit(t)
	if _, err := shared.Create(u.ctx, tenant+"."+j.ID, mustMarshal(t, queue.CancelRequest{At: time.Now().UTC(), By: "older submit"})); err != nil {
		t.Fatal(err)
	}
	name := "KV_" + queue.CancelBucket
	answer := u.silence(t, name)
	asked, err := b.w.CancelAsked(u.ctx, ref(j.ID))
	if err == nil && !asked {
		t.Errorf("CancelAsked while the shared bucket answered nobody: not asked, no error; want it to say it cannot tell")
	}
	answer()
	if asked, err := b.w.CancelAsked(u.ctx, ref(j.ID)); err != nil || !asked {
		t.Errorf("CancelAsked once it answers: %t, %v; want asked", asked, err)
	}
}
