package queue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/backoff"
)

// A kind of bucket every tenant's keys were in (statuses first) has one bucket per tenant,
// <prefix>_T, under the same keys as before ("T.J…"): a tenant's identity reads a bucket by its
// stream's info with a subject filter (read.go), which the server cannot scope to the filter,
// so in one bucket shared by every tenant team-a listed team-b's job ids. The bucket named
// prefix itself, where an older Boxcar kept every tenant's keys, is no tenant's any more: what
// it still holds of a tenant's job during an upgrade is read by a direct get of the job's key
// alone (sharedBucket), which the server checks against the tenant's permissions and which
// lists nothing. tenantBuckets is that binding, one for each such kind.

// tenantBucket is tenant's bucket of the kind whose shared bucket is prefix. A tenant name is
// lowercase letters, digits and '-', never '_', so it is a bucket name, and no two tenants, nor
// a tenant and the shared bucket, share one (config checks the length and the other names).
func tenantBucket(prefix, tenant string) string { return prefix + "_" + tenant }

// getter is what reads a key's last value: a bucket, or a tenant's keys (bucketReader).
type getter interface {
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
}

// tenantBuckets are the tenants' buckets of one kind, bound at their first use (a worker
// writes its tenants' keys, and `worker setup` may have retired or added a tenant since it
// started), and the kind's shared bucket.
type tenantBuckets struct {
	js     jetstream.JetStream
	prefix string // the shared bucket's name
	what   string // "status", "approvals": for errors
	shared *sharedBucket
	mu     sync.Mutex
	kv     map[string]jetstream.KeyValue // by tenant
}

func newTenantBuckets(js jetstream.JetStream, prefix, what string) *tenantBuckets {
	return &tenantBuckets{js: js, prefix: prefix, what: what, shared: newSharedBucket(js, prefix, what)}
}

// learnShared looks the shared bucket up, for an identity that may (a worker): a deployment
// that began with this version has none, and then nothing more than a tenant's bucket is asked
// for a key. Where there is one, the identity reads it as a worker does (sharedBucket.lookup).
func (b *tenantBuckets) learnShared(ctx context.Context) error {
	b.shared.asWorker = true
	_, err := lookupShared(ctx, b.js, statusStream(b.prefix))
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		b.shared.stream.gone()
	case err != nil:
		return fmt.Errorf("queue: look up the shared %s bucket %s: %w", b.what, b.prefix, err)
	}
	return nil
}

// lookupShared looks up the stream of a bucket or stream every tenant's keys were in (an older
// Boxcar's), for `worker setup` or a worker's start, which act on the answer. A look-up that
// fails, other than the server saying there is no such stream, is asked again, backoff.Delay
// apart and each within sharedLook, for letterRounds: a stream whose leader is elected answers
// again within seconds, and one failed look-up failed the whole setup, every tenant's. Past
// them its error stands.
func lookupShared(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	for round := 1; ; round++ {
		look, cancel := context.WithTimeout(ctx, sharedLook)
		s, err := js.Stream(look, name)
		cancel()
		if err == nil || errors.Is(err, jetstream.ErrStreamNotFound) || round == letterRounds {
			return s, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (%w)", err, context.Cause(ctx))
		case <-time.After(backoff.Delay(round)):
		}
	}
}

// of is tenant's bucket; ErrNotReady when it is missing.
func (b *tenantBuckets) of(ctx context.Context, tenant string) (jetstream.KeyValue, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if kv, ok := b.kv[tenant]; ok {
		return kv, nil
	}
	kv, err := bucket(ctx, b.js, tenantBucket(b.prefix, tenant), b.what)
	if err != nil {
		return nil, err
	}
	if b.kv == nil {
		b.kv = map[string]jetstream.KeyValue{}
	}
	b.kv[tenant] = kv
	return kv, nil
}

// reader is tenant's keys as a reader: its bucket, then the shared one.
func (b *tenantBuckets) reader(ctx context.Context, tenant string) (bucketReader, error) {
	kv, err := b.of(ctx, tenant)
	return bucketReader{KeyValue: kv, shared: b.shared}, err
}

// adopt copies key from the shared bucket into kv, a tenant's, as it is, when kv holds none: a
// job an older worker of an upgrade wrote for keeps what it wrote, which the next write starts
// from. A value kv holds already stays: it is the newer, as no worker of this version writes
// the shared bucket.
func (b *tenantBuckets) adopt(ctx context.Context, kv jetstream.KeyValue, key string) error {
	e, err := b.shared.lookup(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := kv.Create(ctx, key, e.Value()); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("queue: move %s from the shared %s bucket %s: %w", key, b.what, b.prefix, err)
	}
	return nil
}

// adoptWaiting is adopt asked again, backoff.Delay apart, while the shared bucket's stream is
// there and answers nobody, until ctx ends: for a caller whose failure nobody tries again (a
// request for approval, whose failure denies the command to the model).
func (b *tenantBuckets) adoptWaiting(ctx context.Context, kv jetstream.KeyValue, key string) error {
	for round := 1; ; round++ {
		err := b.adopt(ctx, kv, key)
		if !errors.Is(err, errUnanswered) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", err, context.Cause(ctx))
		case <-time.After(backoff.Delay(round)):
		}
	}
}

// moveShared copies, for each tenant, its keys in b's shared bucket whose value is done with
// (moved: nobody writes it any more, such as an ended job's status) into the tenant's bucket,
// where its tenant lists them; a key the tenant's bucket holds already is left. The others stay
// where they are: an older worker may still write them, which a copy made now would hide; a
// reader finds them there by their key, and the next `worker setup` copies them once done.
// Nothing is removed from the shared bucket, which older workers still use during an upgrade.
func (a *Admin) moveShared(ctx context.Context, b *tenantBuckets, tenants []string, moved func(key string, data []byte) bool) error {
	shared, err := a.js.KeyValue(ctx, b.prefix)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil // no older Boxcar wrote here
	}
	if err != nil {
		return fmt.Errorf("queue: look up the shared %s bucket %s: %w", b.what, b.prefix, err)
	}
	for _, tenant := range tenants {
		n, err := a.moveTenant(ctx, b, shared, tenant, moved)
		if err != nil {
			return err
		}
		if n > 0 {
			a.log.InfoContext(ctx, "copied what a tenant's ended jobs left in a shared bucket into the tenant's own",
				"tenant", tenant, "from", b.prefix, "to", tenantBucket(b.prefix, tenant), "keys", n)
		}
	}
	return nil
}

// moveTenant is moveShared for one tenant; it returns how many keys it copied.
func (a *Admin) moveTenant(ctx context.Context, b *tenantBuckets, shared jetstream.KeyValue, tenant string, moved func(string, []byte) bool) (int, error) {
	name := tenantBucket(b.prefix, tenant)
	kv, err := b.of(ctx, tenant)
	if err != nil {
		return 0, err
	}
	have, err := listKeys(ctx, a.js, name, tenant+".>")
	if err != nil {
		return 0, fmt.Errorf("queue: %w", err)
	}
	old, err := listKeys(ctx, a.js, b.prefix, tenant+".>")
	if err != nil {
		return 0, fmt.Errorf("queue: %w", err)
	}
	held := make(map[string]bool, len(have))
	for _, k := range have {
		held[k] = true
	}
	missing := slices.DeleteFunc(old, func(k string) bool { return held[k] })
	n := 0
	for i, r := range getEach(ctx, shared, missing) {
		if r.err != nil || !moved(missing[i], r.entry.Value()) {
			continue // deleted, purged or expired since it was listed, a timeout (the next setup), or still in use
		}
		_, err = kv.Create(ctx, missing[i], r.entry.Value())
		switch {
		case err == nil:
			n++
		case !errors.Is(err, jetstream.ErrKeyExists):
			return n, fmt.Errorf("queue: copy %s from %s into %s: %w", missing[i], b.prefix, name, err)
		}
	}
	return n, nil
}

// bucketReader reads a tenant's keys: its bucket, then, for a key it does not hold, the shared
// bucket (sharedBucket).
type bucketReader struct {
	jetstream.KeyValue
	shared *sharedBucket
}

// Get is the key's last value in the tenant's bucket, else in the shared one.
func (r bucketReader) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	e, err := r.KeyValue.Get(ctx, key)
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return e, err
	}
	return r.shared.Get(ctx, key)
}

// sharedBucket reads one key of a shared bucket by a direct get with the key in the request's
// subject, the only read of it a tenant's identity is granted.
type sharedBucket struct {
	js           jetstream.JetStream
	bucket, what string
	stream       *sharedStream
	// asWorker: Get is lookup, for an identity that may look the stream up (learnShared).
	asWorker bool
}

func newSharedBucket(js jetstream.JetStream, bucket, what string) *sharedBucket {
	return &sharedBucket{js: js, bucket: bucket, what: what, stream: &sharedStream{nc: js.Conn(), name: statusStream(bucket)}}
}

// Create writes key unless it holds a value, by a publish on its subject alone: all a tenant's
// identity may write of a shared bucket (natsconfig), where an older worker watches for it.
func (s *sharedBucket) Create(ctx context.Context, key string, value []byte, _ ...jetstream.KVCreateOpt) (uint64, error) {
	return s.Update(ctx, key, value, 0)
}

// Update writes key if its last value is at revision last (0: it holds none), as
// jetstream.KeyValue's Update, by a publish on its subject.
func (s *sharedBucket) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	msg := nats.NewMsg("$KV." + s.bucket + "." + key)
	msg.Data = value
	msg.Header.Set(lastSubject, strconv.FormatUint(last, 10))
	ack, err := s.js.PublishMsg(ctx, msg)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// Get is the key's last value in the shared bucket; jetstream.ErrKeyNotFound when it holds
// none, or there is no such bucket or no grant to read it.
func (s *sharedBucket) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if s.asWorker {
		return s.lookup(ctx, key)
	}
	msg, err := s.stream.get(ctx, "$KV."+s.bucket+"."+key)
	return s.entry(key, msg, err)
}

// lookup is Get for a worker, which acts on what it reads (writes a status starting from it,
// runs a job no cancel names) and may look the stream up. Nobody answering is no value only
// when the server says the stream is gone: a worker that took a stream electing its leader, or
// its server restarting, as holding nothing (and remembered that for sharedRelook) wrote a
// job's status from scratch (an older worker's running job recorded cancelled before it
// started, say), which then hid every status the older worker wrote for it, and ran a job an
// older submit had asked to cancel. So it is an error then, and the worker asks again. Only a
// stream the server says is gone is remembered absent (for sharedRelook, or for good from the
// worker's start: learnShared).
func (s *sharedBucket) lookup(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	msg, err := s.stream.lookup(ctx, s.js, "$KV."+s.bucket+"."+key)
	return s.entry(key, msg, err)
}

// entry is the value a direct get of key read (msg; nil: none), or its error.
func (s *sharedBucket) entry(key string, msg *nats.Msg, err error) (jetstream.KeyValueEntry, error) {
	switch {
	case err != nil:
		return nil, fmt.Errorf("queue: read %s in the shared %s bucket %s: %w", key, s.what, s.bucket, err)
	case msg == nil, msg.Header.Get("KV-Operation") != "": // a delete or purge marker is no value
		return nil, jetstream.ErrKeyNotFound
	}
	seq, _ := strconv.ParseUint(msg.Header.Get(jetstream.SequenceHeader), 10, 64)
	return sharedEntry{bucket: s.bucket, key: key, value: msg.Data, rev: seq}, nil
}

// sharedStream reads the last message of one subject of a stream every tenant's keys were in,
// by a direct get with the subject in the request's. No such stream (a deployment that began
// with this version, or one an upgrade drained and removed) and a refusal (credentials
// generated without the grant) are no message there. The client remembers for good what
// cannot change while it runs: a worker's look-up at its start found no stream (no Boxcar of
// this version makes one), or the server refused the grant (a login's grants do not change
// while it is connected). Nobody answering a direct get is also what a stream that is there
// says while its leader is elected or its server restarts: a worker, which may look the stream
// up, remembers it absent for sharedRelook only when the server says it is gone (lookup); a
// tenant's read takes it as none for that read alone (get).
type sharedStream struct {
	nc   *nats.Conn
	name string
	// absentUntil is when the client asks the stream again (the now clock's Unix nanoseconds;
	// forGood); 0, it asks.
	absentUntil atomic.Int64
	now         func() time.Time // the clock of absentUntil; nil is time.Now
}

// sharedRelook is how long a worker takes a stream the server said is gone as absent: a few
// requests a minute while there is none, and one made again (an older Boxcar's) seen within a
// minute.
const sharedRelook = time.Minute

// forGood is an absentUntil that never comes.
const forGood = math.MaxInt64

// absent reports whether the client takes the stream as absent now.
func (s *sharedStream) absent() bool {
	until := s.absentUntil.Load()
	return until == forGood || until > 0 && s.clock() < until
}

// gone has the client take the stream as absent for good.
func (s *sharedStream) gone() { s.absentUntil.Store(forGood) }

// goneAWhile has the client take the stream as absent for sharedRelook, unless it knows for good.
func (s *sharedStream) goneAWhile() {
	until := s.clock() + int64(sharedRelook)
	for cur := s.absentUntil.Load(); cur != forGood && !s.absentUntil.CompareAndSwap(cur, until); cur = s.absentUntil.Load() {
	}
}

func (s *sharedStream) clock() int64 {
	if s.now != nil {
		return s.now().UnixNano()
	}
	return time.Now().UnixNano()
}

// get is the last message on subject; nil when there is none (ask), or when nobody answered.
// It is a tenant's read, which may not look the stream up (its info lists every tenant's keys)
// to tell a stream that is gone from one electing its leader: nobody answering is none for this
// read alone, and the next one asks again. Remembered for sharedRelook, one silent moment
// during an upgrade had a submitter's `watch` show a job an older worker ran as queued, and its
// cancel read as not asked, for a minute. A no-responders answer costs one round trip.
func (s *sharedStream) get(ctx context.Context, subject string) (*nats.Msg, error) {
	if s.absent() {
		return nil, nil
	}
	msg, err := s.ask(ctx, subject)
	if errors.Is(err, errUnanswered) {
		return nil, nil
	}
	return msg, err
}

// errUnanswered: nobody answered a direct get of a shared stream (ask).
var errUnanswered = errors.New("nobody answered a direct get")

// ask is the last message on subject by a direct get, whatever the client takes the stream
// as; nil when there is none or the server refused the grant (remembered for good);
// errUnanswered when nobody answered.
func (s *sharedStream) ask(ctx context.Context, subject string) (*nats.Msg, error) {
	api := "$JS.API.DIRECT.GET." + s.name + "." + subject
	var found *nats.Msg
	err := unlessRefused(ctx, s.nc, []string{api}, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, sharedLook)
		defer cancel()
		msg, err := s.nc.RequestWithContext(ctx, api, nil)
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			return errUnanswered
		case err != nil:
			return err
		}
		switch status := msg.Header.Get("Status"); status {
		case "":
			found = msg
		case "404":
		default:
			return fmt.Errorf("%s %s", status, msg.Header.Get("Description"))
		}
		return nil
	})
	if errors.Is(err, ErrRefused) {
		s.gone()
		return nil, nil
	}
	return found, err
}

// lookup is ask for a worker, which acts on what it reads and may look the stream up: nobody
// answering is no message only when the server says the stream is gone (then remembered for
// sharedRelook); while the stream is there, or cannot be looked up, it is an error wrapping
// errUnanswered, and the caller asks again.
func (s *sharedStream) lookup(ctx context.Context, js jetstream.JetStream, subject string) (*nats.Msg, error) {
	if s.absent() {
		return nil, nil
	}
	msg, err := s.ask(ctx, subject)
	if !errors.Is(err, errUnanswered) {
		return msg, err
	}
	_, lerr := js.Stream(ctx, s.name)
	switch {
	case errors.Is(lerr, jetstream.ErrStreamNotFound):
		s.goneAWhile() // gone (an upgrade's end removed it): asked again after sharedRelook
		return nil, nil
	case lerr != nil:
		return nil, fmt.Errorf("%w, and its stream %s could not be looked up (%w); try again once NATS is settled", err, s.name, lerr)
	}
	return nil, fmt.Errorf("%w: its stream %s is there and answers nobody, its leader being elected or its server restarting; try again once NATS is settled", err, s.name)
}

// sharedEntry is a value read from a shared bucket; its revision is the shared bucket's,
// never one to write a tenant's bucket with.
type sharedEntry struct {
	bucket, key string
	value       []byte
	rev         uint64
}

func (e sharedEntry) Bucket() string                  { return e.bucket }
func (e sharedEntry) Key() string                     { return e.key }
func (e sharedEntry) Value() []byte                   { return e.value }
func (e sharedEntry) Revision() uint64                { return e.rev }
func (e sharedEntry) Created() time.Time              { return time.Time{} }
func (e sharedEntry) Delta() uint64                   { return 0 }
func (e sharedEntry) Operation() jetstream.KeyValueOp { return jetstream.KeyValuePut }
