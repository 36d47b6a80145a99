package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/backoff"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
)

// CancelRequest is what a submitter writes to ask for a job to be cancelled. The worker records
// the outcome in the job's status, which only workers write.
type CancelRequest struct {
	At time.Time `json:"at"`
	// By is who asked, as the submitter claims it (user@host): a claim, not an identity.
	By string `json:"by,omitempty"`
	// Released: the job's end is committed, and the request, written with no expiry, now
	// expires with the bucket (ReleaseCancel). Set by a worker.
	Released bool `json:"released,omitempty"`
}

// setUpCancel creates or updates each tenant's cancel bucket, and updates the shared one where
// an older Boxcar made it (its submitters and workers use it during an upgrade), never making
// it. A worker that starts reads every request still there and ends the jobs they name. A
// request expires status_ttl after its last write, as a status does, except one written with
// no expiry (Cancel): the buckets allow a TTL per request for that. Nothing moves: every worker
// of this version watches both (watchCancels).
func (a *Admin) setUpCancel(ctx context.Context, tenants []string) error {
	for _, tenant := range tenants {
		if err := declareCancel(ctx, a.js, a.cfg, cancelBucket(tenant)); err != nil {
			return err
		}
	}
	switch _, err := lookupShared(ctx, a.js, statusStream(CancelBucket)); {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("queue: look up the shared cancel bucket %s: %w", CancelBucket, err)
	}
	return declareCancel(ctx, a.js, a.cfg, CancelBucket)
}

// declareCancel creates or updates the cancel bucket name.
func declareCancel(ctx context.Context, js jetstream.JetStream, cfg config.NATS, name string) error {
	_, err := declareBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket:      name,
		Description: "Boxcar: requests to cancel a job, by tenant.job",
		History:     1,
		TTL:         time.Duration(cfg.StatusTTL),
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		// A tenant's submitter writes requests of any id and no expiry (Nats-TTL: never, which
		// a raw publish sets as Cancel does): unbounded, one tenant could fill the server's
		// store, which every tenant's jobs and statuses live in.
		MaxBytes:     orUnlimited(cfg.CancelMaxBytes),
		MaxValueSize: cancelMaxValue,
	})
	if err == nil {
		err = allowKeyTTL(ctx, js, name)
	}
	if err != nil {
		return fmt.Errorf("queue: set up cancel bucket %s: %w", name, err)
	}
	return nil
}

// cancelBucket is tenant's cancel bucket, <CancelBucket>_<tenant>: its stream's info lists
// the job ids its tenant asked to cancel, so each tenant has its own (tenantbuckets.go).
func cancelBucket(tenant string) string { return tenantBucket(CancelBucket, tenant) }

// CancelBucketOf is the name of tenant's cancel bucket, for what names it to an operator.
func CancelBucketOf(tenant string) string { return cancelBucket(tenant) }

// cancelMaxValue bounds one cancel request: its time, who asked (user@host, as claimed) and
// whether it was released take a few hundred bytes.
const cancelMaxValue = 4096

// allowKeyTTL lets the bucket's writers give a key a TTL of its own (Nats-TTL, NATS 2.11).
func allowKeyTTL(ctx context.Context, js jetstream.JetStream, bucket string) error {
	s, err := js.Stream(ctx, statusStream(bucket))
	if err != nil {
		return err
	}
	cfg := s.CachedInfo().Config
	if cfg.AllowMsgTTL {
		return nil
	}
	cfg.AllowMsgTTL = true
	_, err = js.UpdateStream(ctx, cfg)
	return err
}

// A cancel request outlives status_ttl: the job's message stays in the job stream, which has
// no max_age, until a worker takes it, however long the queue waits, and the cancelled status
// of a job that had not started expires status_ttl after the cancel, the request with it. The
// worker that finally took the job would find neither and run it. So Cancel writes the request
// with no expiry (Nats-TTL: never), and the worker that commits the job's cancelled end, after
// which a delivery finds the manifest and never runs it, gives the request back to the bucket's
// expiry (ReleaseCancel).
const (
	ttlHeader   = "Nats-TTL"
	ttlNever    = "never"
	lastSubject = "Nats-Expected-Last-Subject-Sequence"
)

// creator writes a key unless it holds a value: a bucket, or a key of a shared one
// (sharedBucket).
type creator interface {
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
}

// createCancel writes the request for r into the bucket name unless one is there
// (jetstream.ErrKeyExists), with no expiry; a bucket that allows no TTL per key (set up by an
// earlier worker) gets one that expires with the bucket's, written by kv.
func createCancel(ctx context.Context, js jetstream.JetStream, name string, kv creator, r Ref, req CancelRequest) error {
	msg := nats.NewMsg("$KV." + name + "." + r.key())
	msg.Data = mustJSON(req)
	msg.Header.Set(lastSubject, "0")
	msg.Header.Set(ttlHeader, ttlNever)
	_, err := js.PublishMsg(ctx, msg)
	var api *jetstream.APIError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &api) && api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence:
		return jetstream.ErrKeyExists
	case errors.As(err, &api) && api.ErrorCode == jsErrCodeMessageTTLDisabled:
		_, err = kv.Create(ctx, r.key(), msg.Data)
	}
	return atLimit(err, name, cancelLimits)
}

// jsErrCodeMessageTTLDisabled is the server's answer to a TTL on a stream that allows none.
const jsErrCodeMessageTTLDisabled jetstream.ErrorCode = 10166

// ReleaseCancel gives the cancel request of a job whose end is committed back to the bucket's
// expiry (status_ttl from now): no delivery of the job can run it any more. The rewrite says it
// is released, so that a request is released once (a later release would push its expiry back,
// and every worker's watch sees the rewrite and asks again). There being none is not an error.
// A request in the shared bucket, where an older submit asked or a submit of this version asked
// too during an upgrade (Cancel), is released there as well.
func (c *Consumer) ReleaseCancel(ctx context.Context, r Ref) error {
	kv, err := c.cancels.of(ctx, r.Tenant)
	if err == nil {
		err = releaseIn(ctx, kv, r)
	}
	if err == nil && c.sharedCancels != nil {
		err = releaseIn(ctx, c.sharedCancels, r)
	}
	return err
}

// releaseIn is ReleaseCancel in one bucket.
func releaseIn(ctx context.Context, kv jetstream.KeyValue, r Ref) error {
	req, rev, err := read[CancelRequest](ctx, kv, r.key())
	if err == nil && (rev == 0 || req.Released) {
		return nil
	}
	if err == nil {
		req.Released = true
		_, err = kv.Update(ctx, r.key(), mustJSON(req), rev)
	}
	if err != nil && !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSequence(err) {
		return fmt.Errorf("queue: release the cancel request of %s in %s: %w", r, kv.Bucket(), err)
	}
	return nil // or another worker's write came first
}

// Queued reports whether the job's tenant's stream holds a message of the job (or, while the
// worker drains it, the shared stream: drain.go): one no worker has settled. A cancel request
// for a job with neither that nor a status names no job that could run (never submitted, or
// ended and its status expired): the watch lets it expire. One request to the server for each
// stream asked: the streams' handles are the ones the worker bound.
func (c *Consumer) Queued(ctx context.Context, r Ref) (bool, error) {
	s := c.streams[r.Tenant]
	if s == nil {
		return false, fmt.Errorf("queue: look up job %s: tenant %s is not one this worker serves", r.ID, r.Tenant)
	}
	queued, err := inStream(ctx, s, c.cfg, r)
	if queued || err != nil || !c.draining(r.Tenant) {
		return queued, err
	}
	return inStream(ctx, c.shared, c.cfg, r)
}

// CancelAsked reports whether a cancel of the job was asked for: the tenant's cancel bucket
// holds a request, or the shared one does. A worker reads it for a job whose message is older
// than status_ttl, whose cancelled status may have expired while it waited.
func (c *Consumer) CancelAsked(ctx context.Context, r Ref) (bool, error) {
	kv, err := c.cancels.reader(ctx, r.Tenant)
	var rev uint64
	if err == nil {
		_, rev, err = read[CancelRequest](ctx, kv, r.key())
	}
	if err != nil {
		return false, fmt.Errorf("queue: read the cancel request of %s: %w", r, err)
	}
	return rev > 0, nil
}

// Cancel asks for a job of the client's tenant to be cancelled and returns its status as it
// stands, with CancelRequested set: a worker ends a job that has not started as cancelled, and
// stops a running one. Asking twice is harmless. ErrFinal when the job already ended,
// ErrUnknownJob when neither the status bucket nor the job stream knows it. The request goes
// into the tenant's cancel bucket, and, during an upgrade, into the shared one too, by a
// publish of its key alone, where older workers watch (docs/operations.md): every worker sees
// it, whatever its version.
func (c *Client) Cancel(ctx context.Context, id, by string) (job.Status, error) {
	st, err := c.Status(ctx, id)
	if err != nil {
		return job.Status{}, err
	}
	if st.State.Terminal() {
		return st, fmt.Errorf("%w: job %s is already %s", ErrFinal, id, st.State)
	}
	name, req := cancelBucket(c.tenant), CancelRequest{At: time.Now().UTC(), By: by}
	// An identity that may not cancel (an approver) is refused the bucket or the write.
	refusable := []string{"$JS.API.STREAM.INFO." + statusStream(name), "$KV." + name + ".>"}
	err = unlessRefused(ctx, c.js.Conn(), refusable, func(ctx context.Context) error {
		kv, err := bucket(ctx, c.js, name, "cancel")
		if err != nil {
			return err
		}
		return createCancel(ctx, c.js, name, kv, c.ref(id), req)
	})
	if err == nil || errors.Is(err, jetstream.ErrKeyExists) {
		if serr := c.sharedCancel(ctx, c.ref(id), req); serr != nil {
			// The request stands in the tenant's bucket: asking again changes nothing there.
			err = fmt.Errorf("asked in %s, where workers of this version watch, but not in the shared %s older workers watch during an upgrade: %w", name, CancelBucket, serr)
		}
	}
	if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return job.Status{}, fmt.Errorf("queue: cancel %s: %w", id, err)
	}
	st.CancelRequested = true
	return st, nil
}

// sharedCancel writes the request into the shared cancel bucket, for older workers, unless
// there is none: nobody answering the publish is no bucket (sharedStream), as a refusal is
// (credentials generated without the grant, which have no older worker to tell either). A
// bucket whose stream answered nobody for a moment gets the request from a worker of this
// version, which copies it from the tenant's (sharedCopies).
func (c *Client) sharedCancel(ctx context.Context, r Ref, req CancelRequest) error {
	s := c.sharedCancels
	if s.stream.absent() {
		return nil
	}
	err := unlessRefused(ctx, c.js.Conn(), []string{"$KV." + CancelBucket + ".>"}, func(ctx context.Context) error {
		return createCancel(ctx, c.js, CancelBucket, s, r, req)
	})
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse):
		return nil // for this request alone: the client's next read or request asks again
	case errors.Is(err, ErrRefused):
		s.stream.gone()
		return nil
	}
	return err
}

// cancelRequested reports whether a cancel of the job was asked for, in the tenant's cancel
// bucket or the shared one. An identity the server does not let read the cancel bucket (an
// approver) sees none: the status says so once a worker acted on it.
func (c *Client) cancelRequested(ctx context.Context, r Ref) (bool, error) {
	var asked bool
	name := cancelBucket(c.tenant)
	refusable := []string{"$JS.API.STREAM.INFO." + statusStream(name), "$JS.API.DIRECT.GET." + statusStream(name), "$JS.API.DIRECT.GET." + statusStream(name) + ".>"}
	err := unlessRefused(ctx, c.js.Conn(), refusable, func(ctx context.Context) error {
		kv, err := bucket(ctx, c.js, name, "cancel")
		if errors.Is(err, ErrNotReady) {
			return nil // a worker before the tenant's cancel bucket: an older submit asks in the shared one, which the status says once a worker acted on it
		}
		if err != nil {
			return err
		}
		_, rev, err := read[CancelRequest](ctx, bucketReader{KeyValue: kv, shared: c.sharedCancels}, r.key())
		asked = rev > 0
		return err
	})
	if errors.Is(err, ErrRefused) {
		return false, nil
	}
	return asked, err
}

// CancelUpdate is what a tenant's cancel watch delivers: a request's job (Ref), or, with the
// zero Ref, word of how far the watch is (every request there was at its start delivered; an
// entry with nothing to apply read). Behind: the server had more for the watch when it sent
// this, so requests there are still on their way.
type CancelUpdate struct {
	Ref    Ref
	Behind bool
}

// WatchCancels streams the cancel requests of tenant, one of the worker's: every request its
// bucket (and, during an upgrade, the shared one) holds first, then one with the zero Ref and
// not Behind to say those are all, then each new one, until ctx ends or the watch breaks (the
// channel closes; watch again, which reads them all again). Each tenant has a watch of its
// own, so that one tenant's requests, however many, never wait behind another's. A released
// request (its job's end is committed) has nothing left to do: it comes with the zero Ref, as a
// word of how far the watch is. A request asked in both buckets comes twice: applying one
// twice is harmless.
func (c *Consumer) WatchCancels(ctx context.Context, tenant string) (<-chan CancelUpdate, error) {
	if !slices.Contains(c.tenants, tenant) {
		return nil, fmt.Errorf("queue: watch the cancel requests of tenant %q: not one of this worker's tenants (%s)", tenant, strings.Join(c.tenants, ", "))
	}
	return c.watchCancels(ctx, []string{tenant}, tenant+".*", true)
}

// WatchAllCancels is WatchCancels of every tenant of the worker's on one channel, for a reader
// that does nothing slow with what it reads: a watch of each tenant's bucket and one of the
// shared bucket, whatever the number of tenants there. Another tenant's requests in the shared
// bucket come with the zero Ref. (A consumer of several filters is created on an API subject
// that names none, which a worker may not use: a worker of several tenants watches every
// tenant's keys of the shared bucket.)
func (c *Consumer) WatchAllCancels(ctx context.Context) (<-chan CancelUpdate, error) {
	keys := "*.*"
	if len(c.tenants) == 1 {
		keys = c.tenants[0] + ".*"
	}
	return c.watchCancels(ctx, c.tenants, keys, false)
}

// watchCancels streams the requests of tenants' buckets and of sharedKeys in the shared bucket,
// as WatchCancels says, leaving out other tenants'. copyOut: the requests the tenants' buckets
// hold are copied into the shared bucket (sharedCopies).
func (c *Consumer) watchCancels(ctx context.Context, tenants []string, sharedKeys string, copyOut bool) (<-chan CancelUpdate, error) {
	var ws []jetstream.KeyWatcher
	watch := func(kv jetstream.KeyValue, keys string) error {
		// Deletes too (they come with the zero Ref): the last entry a watch reads says
		// whether it is up to date, whatever the entry.
		w, err := kv.Watch(ctx, keys)
		if err != nil {
			return fmt.Errorf("queue: watch the cancel requests of keys %s in %s: %w", keys, kv.Bucket(), err)
		}
		ws = append(ws, w)
		return nil
	}
	var err error
	for _, tenant := range tenants {
		var kv jetstream.KeyValue
		if kv, err = c.cancels.of(ctx, tenant); err == nil {
			err = watch(kv, tenant+".*")
		}
		if err != nil {
			break
		}
	}
	if err == nil && c.sharedCancels != nil {
		err = watch(c.sharedCancels, sharedKeys)
	}
	if err != nil {
		for _, w := range ws {
			stopWatch(w)
		}
		return nil, err
	}
	var copies *sharedCopies
	if copyOut && c.sharedCancels != nil {
		copies = &sharedCopies{shared: len(ws) - 1, wake: make(chan struct{}, 1)}
	}
	out := make(chan CancelUpdate)
	go c.mergeCancels(ctx, ws, copies, out)
	return out, nil
}

// watched is one entry a watch of mergeCancels' read: which watch, and the entry; closed, the
// watch broke.
type watched struct {
	from   int
	entry  jetstream.KeyValueEntry
	closed bool
}

// mergeCancels hands the requests of the watches ws on to out, until ctx ends or a watch
// breaks (out closes, every watch stopped): an update is behind while any watch is. The
// requests of the tenants' buckets go to copies too, when it is not nil.
func (c *Consumer) mergeCancels(ctx context.Context, ws []jetstream.KeyWatcher, copies *sharedCopies, out chan<- CancelUpdate) {
	defer close(out)
	in := make(chan watched)
	fwd, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stop()
		for _, w := range ws {
			stopWatch(w)
		}
		wg.Wait()
	}()
	behind := make([]bool, len(ws))
	for i, w := range ws {
		behind[i] = true // until it delivered every request there was
		wg.Go(func() { forward(fwd, i, w, in) })
	}
	if copies != nil {
		wg.Go(func() { c.copyCancels(fwd, copies) })
	}
	for {
		var got watched
		select {
		case <-ctx.Done():
			return
		case got = <-in:
		}
		if got.closed {
			return
		}
		u := cancelUpdate(got.entry)
		copies.add(got, u)
		behind[got.from] = u.Behind
		u.Behind = slices.Contains(behind, true)
		if !slices.Contains(c.tenants, u.Ref.Tenant) {
			u.Ref = Ref{} // another tenant's, on WatchAllCancels' watch of the shared bucket
		}
		select {
		case out <- u:
		case <-ctx.Done():
			return
		}
	}
}

// forward hands w's entries to in, as watch from, until ctx ends or w breaks.
func forward(ctx context.Context, from int, w jetstream.KeyWatcher, in chan<- watched) {
	for {
		var got watched
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			got = watched{from: from, entry: e, closed: !ok}
		}
		select {
		case in <- got:
		case <-ctx.Done():
			return
		}
		if got.closed {
			return
		}
	}
}

// cancelUpdate is what the watch's entry e says: nil is the end of the requests there were.
func cancelUpdate(e jetstream.KeyValueEntry) CancelUpdate {
	if e == nil {
		return CancelUpdate{}
	}
	u := CancelUpdate{Behind: e.Delta() > 0}
	if r := refOf(e.Key()); e.Operation() == jetstream.KeyValuePut && job.ValidID(r.ID) && !released(e.Value()) {
		u.Ref = r
	}
	return u
}

// stopWatch stops w and reads what it still had to deliver until it closes: its subscription
// hands each entry over holding a lock that its close waits for, so a watch stopped more than
// its buffer (256 entries) behind, as one working through a backlog of requests is, would
// leave the subscription's goroutine blocked for ever.
func stopWatch(w jetstream.KeyWatcher) {
	_ = w.Stop()
	for range w.Updates() {
	}
}

// released reports whether a request says it was released (ReleaseCancel's rewrite, which the
// watch sees as a new request).
func released(data []byte) bool {
	var req CancelRequest
	return json.Unmarshal(data, &req) == nil && req.Released
}

// sharedCopies are the requests a tenant's watch read in its tenant's bucket, to be copied into
// the shared bucket where older workers watch during an upgrade. A submitter writes both, but
// when the shared bucket's stream answers nobody (its leader being elected, its server
// restarting) it cannot tell that from no shared bucket (it may not ask the stream's info,
// which lists every tenant's keys) and writes its tenant's alone: an older worker running the
// job never saw the request. A worker of this version watches the tenant's bucket, may write
// the shared one and may ask its info, so it copies each request it reads there unless the
// shared bucket holds one for the job (a copy is the request the submitter would have
// written; every worker of the tenant tries, one writes it). Only the tenant's watch copies,
// not the one of every tenant's requests that stops attempts (stops, internal/runner).
type sharedCopies struct {
	shared  int // the watch of the shared bucket, whose requests are not copied
	mu      sync.Mutex
	pending []Ref
	wake    chan struct{} // holds one wake-up while pending has requests copyCancels has not taken
}

// add queues the request u of the watched entry got for a copy, unless it is of the shared
// bucket or none. A nil sharedCopies copies nothing.
func (s *sharedCopies) add(got watched, u CancelUpdate) {
	if s == nil || got.from == s.shared || u.Ref == (Ref{}) {
		return
	}
	s.mu.Lock()
	s.pending = append(s.pending, u.Ref)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// take is the requests queued, none queued any more.
func (s *sharedCopies) take() []Ref {
	s.mu.Lock()
	defer s.mu.Unlock()
	refs := s.pending
	s.pending = nil
	return refs
}

// copyCancels copies the requests queued in s, in order, until ctx ends.
func (c *Consumer) copyCancels(ctx context.Context, s *sharedCopies) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		}
		for _, r := range s.take() {
			c.copyCancel(ctx, r)
		}
	}
}

// copyCancel copies r's request in its tenant's bucket into the shared one (copyOnce). While
// the shared bucket's stream is there but answers nobody it is offered the request again,
// backoff.Delay apart, for as long as the watch lasts: the older worker running the job waits
// for it.
func (c *Consumer) copyCancel(ctx context.Context, r Ref) {
	kv, err := c.cancels.of(ctx, r.Tenant)
	for round := 1; err == nil; round++ {
		var again bool
		if again, err = c.copyOnce(ctx, kv, r); !again {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff.Delay(round)):
		}
	}
	if err != nil && ctx.Err() == nil {
		c.log.WarnContext(ctx, "cannot copy a cancel request into the shared cancel bucket, where older workers watch during an upgrade: an older worker running the job does not stop it; ask again with `submit cancel` once NATS is settled",
			"job_id", r.ID, "tenant", r.Tenant, "bucket", CancelBucket, "error", err)
	}
}

// copyOnce writes r's request, read in the tenant's bucket kv, into the shared bucket, unless
// the shared one holds a request of r, the tenant's was released (r's end is committed: no
// older worker has anything to do) or the shared bucket is gone. again: its stream is there
// and answered nobody.
func (c *Consumer) copyOnce(ctx context.Context, kv jetstream.KeyValue, r Ref) (again bool, err error) {
	req, rev, err := read[CancelRequest](ctx, kv, r.key())
	if err != nil || rev == 0 || req.Released {
		return false, err
	}
	err = createCancel(ctx, c.js, CancelBucket, c.sharedCancels, r, req)
	switch {
	case errors.Is(err, jetstream.ErrKeyExists):
		return false, nil
	case errors.Is(err, jetstream.ErrNoStreamResponse):
		return c.streamThere(ctx, statusStream(CancelBucket)), nil
	}
	return false, err
}
