package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
)

// Each tenant's statuses are in a bucket of its own, <status_bucket>_T, under the same keys as
// before ("T.J"). A tenant's identity reads a bucket by its stream's info with a subject filter
// (the keys: read.go), which the server cannot scope to the filter, so in one bucket shared by
// every tenant team-a's submitter listed team-b's job ids. The bucket named status_bucket
// itself, where an older Boxcar's workers wrote every tenant's statuses, is no tenant's any
// more: `worker setup` copies the ended jobs' statuses from it into their tenants' buckets
// (moveStatuses), and while an upgrade runs, what it still holds of a tenant's job (one an
// older worker runs) is read by a direct get of the job's key alone (sharedStatuses), which
// the server checks against the tenant's permissions and which lists nothing.

// statusBucket is tenant's status bucket: <status_bucket>_T. A tenant name is lowercase letters,
// digits and '-', never '_', so it is a bucket name, and no two tenants, nor a tenant and the
// shared bucket, share one (config checks the length and the other names).
func statusBucket(cfg config.NATS, tenant string) string { return cfg.StatusBucket + "_" + tenant }

// StatusBucket is the name of tenant's status bucket, for what names it to an operator.
func StatusBucket(cfg config.NATS, tenant string) string { return statusBucket(cfg, tenant) }

// getter is what reads a key's last value: a bucket, or a tenant's statuses (statusReader).
type getter interface {
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
}

// statusReader reads a tenant's statuses: its bucket, then, for a key it does not hold, the
// shared bucket (sharedStatuses).
type statusReader struct {
	jetstream.KeyValue
	shared sharedStatuses
}

// Get is the key's last value in the tenant's bucket, else in the shared one.
func (s statusReader) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	e, err := s.KeyValue.Get(ctx, key)
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return e, err
	}
	return s.shared.Get(ctx, key)
}

// sharedStatuses reads one key of the shared status bucket by a direct get with the key in the
// request's subject, the only read of it a tenant's identity is granted. No answer (no shared
// bucket: a deployment that began with this version) and a refusal (credentials generated
// without the grant) are no value there: jetstream.ErrKeyNotFound.
type sharedStatuses struct {
	nc     *nats.Conn // nil: there is no shared bucket (newStatusBuckets)
	bucket string
}

// Get is the key's last value in the shared bucket.
func (s sharedStatuses) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if s.nc == nil {
		return nil, jetstream.ErrKeyNotFound
	}
	subject := "$JS.API.DIRECT.GET." + statusStream(s.bucket) + ".$KV." + s.bucket + "." + key
	var e jetstream.KeyValueEntry
	err := unlessRefused(ctx, s.nc, []string{subject}, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, sharedLook)
		defer cancel()
		msg, err := s.nc.RequestWithContext(ctx, subject, nil)
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			return nil
		case err != nil:
			return fmt.Errorf("queue: read %s in the shared status bucket %s: %w", key, s.bucket, err)
		}
		switch status := msg.Header.Get("Status"); {
		case status == "404":
		case status != "":
			return fmt.Errorf("queue: read %s in the shared status bucket %s: %s %s", key, s.bucket, status, msg.Header.Get("Description"))
		case msg.Header.Get("KV-Operation") == "": // a delete or purge marker is no value
			seq, _ := strconv.ParseUint(msg.Header.Get(jetstream.SequenceHeader), 10, 64)
			e = sharedEntry{bucket: s.bucket, key: key, value: msg.Data, rev: seq}
		}
		return nil
	})
	switch {
	case errors.Is(err, ErrRefused):
		return nil, jetstream.ErrKeyNotFound
	case err != nil:
		return nil, err
	case e == nil:
		return nil, jetstream.ErrKeyNotFound
	}
	return e, nil
}

// sharedEntry is a value read from the shared status bucket; its revision is the shared
// bucket's, never one to write the tenant's bucket with.
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

// statusBuckets are the tenants' status buckets a worker writes, bound at their first use: a
// worker writes the statuses of its tenants' jobs, and `worker setup` may have retired or
// added a tenant since it started.
type statusBuckets struct {
	js     jetstream.JetStream
	cfg    config.NATS
	shared sharedStatuses
	mu     sync.Mutex
	kv     map[string]jetstream.KeyValue // by tenant
}

// newStatusBuckets is a worker's statusBuckets. It reads the shared bucket only when there is
// one, which no Boxcar of this version makes: a deployment that began with it asks nothing
// more for a job's first status than its tenant's bucket.
func newStatusBuckets(ctx context.Context, js jetstream.JetStream, cfg config.NATS) (*statusBuckets, error) {
	b := &statusBuckets{js: js, cfg: cfg, shared: sharedStatuses{nc: js.Conn(), bucket: cfg.StatusBucket}}
	_, err := js.Stream(ctx, statusStream(cfg.StatusBucket))
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		b.shared.nc = nil
	case err != nil:
		return nil, fmt.Errorf("queue: look up the shared status bucket %s: %w", cfg.StatusBucket, err)
	}
	return b, nil
}

// of is tenant's status bucket; ErrNotReady when it is missing.
func (b *statusBuckets) of(ctx context.Context, tenant string) (jetstream.KeyValue, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if kv, ok := b.kv[tenant]; ok {
		return kv, nil
	}
	kv, err := bucket(ctx, b.js, statusBucket(b.cfg, tenant), "status")
	if err != nil {
		return nil, err
	}
	if b.kv == nil {
		b.kv = map[string]jetstream.KeyValue{}
	}
	b.kv[tenant] = kv
	return kv, nil
}

// reader is tenant's statuses as a reader: its bucket, then the shared one.
func (b *statusBuckets) reader(ctx context.Context, tenant string) (statusReader, error) {
	kv, err := b.of(ctx, tenant)
	return statusReader{KeyValue: kv, shared: b.shared}, err
}

// adopt copies the job's status from the shared bucket into its tenant's, as it is, when the
// tenant's holds none: a job an older worker of an upgrade wrote a status for (claimed, ran,
// was cancelled) keeps its attempt and its end, which UpdateStatus's conditions hold the next
// write to. A status the tenant's bucket holds already stays: it is the newer, as no worker of
// this version writes the shared bucket.
func (b *statusBuckets) adopt(ctx context.Context, kv jetstream.KeyValue, r Ref) error {
	e, err := b.shared.Get(ctx, r.key())
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := kv.Create(ctx, r.key(), e.Value()); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("queue: move the status of %s from the shared bucket %s: %w", r, b.shared.bucket, err)
	}
	return nil
}

// moveStatuses copies, for each tenant, the statuses of its ended jobs from the shared status
// bucket an older Boxcar's workers wrote into the tenant's own, where its tenant lists them
// (`submit list`); a key the tenant's bucket holds already is left. A job that has not ended
// stays where it is: an older worker may still write its end there, which a copy made now
// would hide; a reader finds it there by its key until a worker of this version writes it
// (adopt), or the next `worker setup` copies its end. A copy expires status_ttl after it was
// made. Nothing is removed from the shared bucket, which older workers still write during an
// upgrade.
func (a *Admin) moveStatuses(ctx context.Context, tenants []string) error {
	shared, err := a.js.KeyValue(ctx, a.cfg.StatusBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil // no older Boxcar wrote here
	}
	if err != nil {
		return fmt.Errorf("queue: look up the shared status bucket %s: %w", a.cfg.StatusBucket, err)
	}
	for _, tenant := range tenants {
		n, err := a.moveTenantStatuses(ctx, shared, tenant)
		if err != nil {
			return err
		}
		if n > 0 {
			a.log.InfoContext(ctx, "copied the statuses of a tenant's ended jobs from the shared status bucket into the tenant's own",
				"tenant", tenant, "from", a.cfg.StatusBucket, "to", statusBucket(a.cfg, tenant), "statuses", n)
		}
	}
	return nil
}

// moveTenantStatuses is moveStatuses for one tenant; it returns how many statuses it copied.
func (a *Admin) moveTenantStatuses(ctx context.Context, shared jetstream.KeyValue, tenant string) (int, error) {
	name := statusBucket(a.cfg, tenant)
	kv, err := a.js.KeyValue(ctx, name)
	if err != nil {
		return 0, fmt.Errorf("queue: look up status bucket %s: %w", name, err)
	}
	have, err := listKeys(ctx, a.js, name, tenant+".*")
	if err != nil {
		return 0, fmt.Errorf("queue: %w", err)
	}
	held := map[string]bool{}
	for _, k := range have {
		held[k] = true
	}
	old, err := listKeys(ctx, a.js, a.cfg.StatusBucket, tenant+".*")
	if err != nil {
		return 0, fmt.Errorf("queue: %w", err)
	}
	var missing []string
	for _, k := range old {
		if !held[k] {
			missing = append(missing, k)
		}
	}
	n := 0
	for i, r := range getEach(ctx, shared, missing) {
		if r.err != nil {
			continue // deleted, purged or expired since it was listed; a timeout: the next setup
		}
		st, err := decodeStatus(r.entry.Value())
		if err != nil || !st.State.Terminal() {
			continue
		}
		_, err = kv.Create(ctx, missing[i], r.entry.Value())
		switch {
		case err == nil:
			n++
		case !errors.Is(err, jetstream.ErrKeyExists):
			return n, fmt.Errorf("queue: copy the status %s from %s into %s: %w", missing[i], a.cfg.StatusBucket, name, err)
		}
	}
	return n, nil
}

// declareStatuses creates or updates each tenant's status bucket, and the shared one where an
// older Boxcar made it (its workers bind it during an upgrade; a deployment that began with
// this version has none), then copies the shared bucket's ended statuses (moveStatuses).
func (a *Admin) declareStatuses(ctx context.Context, tenants []string) error {
	for _, tenant := range tenants {
		want := statusBucketConfig(a.cfg, tenant)
		if _, err := setUpStatus(ctx, a.js, want, a.worker, a.log); err != nil {
			return fmt.Errorf("queue: set up status bucket %s of tenant %s: %w", want.Bucket, tenant, err)
		}
	}
	switch _, err := a.js.Stream(ctx, statusStream(a.cfg.StatusBucket)); {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("queue: look up the shared status bucket %s: %w", a.cfg.StatusBucket, err)
	}
	shared := statusBucketConfig(a.cfg, "")
	shared.Bucket, shared.Description = a.cfg.StatusBucket, "Boxcar job status by tenant.job, written by workers before each tenant had a bucket of its own"
	if err := updateStatusBucket(ctx, a.js, shared, a.worker, a.log); err != nil {
		return fmt.Errorf("queue: update the shared status bucket %s: %w", a.cfg.StatusBucket, err)
	}
	return a.moveStatuses(ctx, tenants)
}
