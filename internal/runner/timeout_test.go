package runner_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/store"
)

// job_timeout "bounds the whole job" (config), and an attempt "holds its slot at most twice
// its job_timeout" (lifecycle.md): every stage of an attempt ends by its deadline, also one
// that waits on a store that stops sending or reading mid-body. The S3 client has no read
// timeout (its http.Client's Timeout is the SDK's, zero), so only the call's context ends
// such a stream; an attempt whose stage waited on it for ever would hold the job running,
// its delivery kept alive by heartbeats, and the worker's slot.

// shortTimeout gives profile p a job_timeout of 1s: an attempt gives up after 2s, its commit
// after the harness's CleanupTimeout (5s) at most.
func shortTimeout(b *bundle) {
	p := b.cfg.Profiles["p"]
	p.Limits.JobTimeout = config.Duration(time.Second)
	b.cfg.Profiles = map[string]config.Profile{"p": p}
}

// stallingGetStore answers a Get of the keys stall names with a body that gives its first
// bytes and then nothing until the request's context ends: a store (or a proxy in front of
// it) that stops sending mid-body.
type stallingGetStore struct {
	store.Store
	stall func(key string) bool
}

func (s *stallingGetStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	rc, err := s.Store.Get(ctx, key)
	if err != nil || !s.stall(key) {
		return rc, err
	}
	return &stalledBody{ctx: ctx, rc: rc}, nil
}

type stalledBody struct {
	ctx  context.Context
	rc   io.ReadCloser
	sent bool
}

func (b *stalledBody) Read(p []byte) (int, error) {
	if !b.sent && len(p) > 0 {
		b.sent = true
		return b.rc.Read(p[:1])
	}
	<-b.ctx.Done()
	return 0, b.ctx.Err()
}

func (b *stalledBody) Close() error { return b.rc.Close() }

// TestJobTimeoutBoundsAStalledInputCopy: the store stops sending an input's body mid-stream
// while it is copied into the sandbox, on the job's last delivery. The copy gives up when the
// run must start to keep its job_timeout, as the waits before the run do, and the attempt ends
// as one whose store is still down then: dead, its own error saying which copy failed, the
// agent never run. Without that bound the attempt would hold its slot for ever; the job would
// end only once its heartbeats stopped at their own bound and the delivery after the last
// found it exhausted ("no worker finished the job").
func TestJobTimeoutBoundsAStalledInputCopy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	oneDelivery(b)
	shortTimeout(b)
	stalling := &stallingGetStore{Store: b.shared, stall: func(key string) bool { return strings.Contains(key, "inputs/") }}
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		t.Errorf("the agent ran on inputs that were never copied")
		return writeReport(ctx, req)
	}), func(c *runner.Config) { c.Store = stalling })
	j := b.submit("p")
	st := b.waitFinal(j.ID, time.Minute)
	if st.State != job.StateDead || !strings.Contains(st.Error, "job_timeout") {
		t.Errorf("job whose input copy stalled ended %s (%q); want dead by its own attempt, the copy named", st.State, st.Error)
	}
}

// stallingPutStore takes the first byte of the body of each create-only put stall names, then
// reads nothing more until the request's context ends: a store that stops reading mid-upload.
type stallingPutStore struct {
	store.Store
	stall func(key string) bool
}

func (s *stallingPutStore) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	if !s.stall(key) {
		return s.Store.PutIfAbsent(ctx, key, r, size)
	}
	_, _ = r.Read(make([]byte, 1))
	<-ctx.Done()
	return ctx.Err()
}

// TestJobTimeoutBoundsAStalledUpload: the store stops reading the report's upload mid-body, on
// the job's last delivery. The commit gives up at the attempt's deadline (or a CleanupTimeout
// after the run, when less is left), as it does for a store still down then, and the attempt
// ends the job dead with its own error, which names the upload; its transcript, which the store
// takes, is committed with that end.
func TestJobTimeoutBoundsAStalledUpload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	oneDelivery(b)
	shortTimeout(b)
	stalling := &stallingPutStore{Store: b.shared, stall: func(key string) bool {
		return strings.Contains(key, "/attempts/") && strings.HasSuffix(key, "/report.md")
	}}
	b.worker(agentFunc(writeReport), func(c *runner.Config) { c.Store = stalling })
	j := b.submit("p")
	st := b.waitFinal(j.ID, time.Minute)
	if st.State != job.StateDead || !strings.Contains(st.Error, "could not be uploaded") {
		t.Errorf("job whose upload stalled ended %s (%q); want dead by its own attempt, the upload named", st.State, st.Error)
	}
	if m := b.manifest(j.ID); m.Predicate.Attempt != 1 {
		t.Errorf("the job's end was committed by delivery %d; want the one whose upload stalled", m.Predicate.Attempt)
	}
}
