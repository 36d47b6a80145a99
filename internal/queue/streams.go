package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
)

// limit is a stream setting the worker takes from its config and an operator may change with
// `nats stream edit`.
type limit struct {
	name string
	get  func(*jetstream.StreamConfig) string
	set  func(dst, src *jetstream.StreamConfig)
}

var limits = []limit{
	{"max_msgs", func(c *jetstream.StreamConfig) string { return fmt.Sprint(c.MaxMsgs) }, func(d, s *jetstream.StreamConfig) { d.MaxMsgs = s.MaxMsgs }},
	{"max_bytes", func(c *jetstream.StreamConfig) string { return fmt.Sprint(c.MaxBytes) }, func(d, s *jetstream.StreamConfig) { d.MaxBytes = s.MaxBytes }},
	{"max_age", func(c *jetstream.StreamConfig) string { return c.MaxAge.String() }, func(d, s *jetstream.StreamConfig) { d.MaxAge = s.MaxAge }},
	{"duplicate_window", func(c *jetstream.StreamConfig) string { return c.Duplicates.String() }, func(d, s *jetstream.StreamConfig) { d.Duplicates = s.Duplicates }},
}

// setMeta is the stream metadata key under which the worker records the value it set last.
func setMeta(name string) string { return "boxcar.set." + name }

// ensureStream creates the stream when it is missing. When it exists, the worker changes a
// limit only while it still holds the value the worker set last (recorded in the stream's
// metadata), so a limit an operator edited with `nats stream edit` is kept, and said so in
// the log, rather than reverted at the next start. earlier is what workers that recorded
// nothing set: a stream they made is treated as if they had recorded it. Every other field
// (subjects, retention, size of a message, the discard policy, the one message per job
// subject that keeps a job from being queued twice, the republish of what is stored, direct
// gets, and roll-ups, never allowed: see allowRollups) is the worker's and always set: they are what the
// queue means, not how much it holds. So are the keys of want's metadata (a job stream's names
// the settings its bounds come from), beside the values recorded; other keys are kept.
func ensureStream(ctx context.Context, js jetstream.JetStream, want, earlier jetstream.StreamConfig, log *slog.Logger) (jetstream.Stream, error) {
	record := maps.Clone(want.Metadata)
	if record == nil {
		record = map[string]string{}
	}
	for _, l := range limits {
		record[setMeta(l.name)] = l.get(&want)
	}
	s, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		created := want
		created.Metadata = record
		s, err = js.CreateStream(ctx, created)
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return s, err
		}
		s, err = js.Stream(ctx, want.Name) // another worker made it first
	}
	if err != nil {
		return nil, err
	}
	cur := s.CachedInfo().Config
	next := cur
	next.Description, next.Subjects, next.Retention, next.MaxMsgSize, next.Replicas = want.Description, want.Subjects, want.Retention, want.MaxMsgSize, want.Replicas
	next.Discard, next.MaxMsgsPerSubject, next.DiscardNewPerSubject = want.Discard, want.MaxMsgsPerSubject, want.DiscardNewPerSubject
	next.RePublish, next.AllowRollup, next.AllowDirect = want.RePublish, allowRollups, want.AllowDirect
	next.Metadata = maps.Clone(cur.Metadata)
	if next.Metadata == nil {
		next.Metadata = map[string]string{}
	}
	maps.Copy(next.Metadata, want.Metadata)
	for _, l := range limits {
		last, ok := cur.Metadata[setMeta(l.name)]
		if !ok {
			last = l.get(&earlier)
		}
		switch now := l.get(&cur); {
		case now == last:
			l.set(&next, &want)
			next.Metadata[setMeta(l.name)] = l.get(&want)
		case now != l.get(&want):
			log.Warn("keeping a stream limit an operator changed; the config's value is not applied (to apply it, set the stream back to the value boxcar set last)",
				"stream", want.Name, "setting", l.name, "value", now, "config", l.get(&want), "boxcar_set_last", last)
		}
	}
	if reflect.DeepEqual(next, cur) {
		return s, nil
	}
	return js.UpdateStream(ctx, next)
}

// orUnlimited is a limit as the server holds it: -1 for none (a config without defaults).
func orUnlimited(v int64) int64 {
	if v <= 0 {
		return -1
	}
	return v
}

// statusStream is the stream behind the status bucket.
func statusStream(bucket string) string { return "KV_" + bucket }

// updateStatusBucket brings an existing status bucket to cfg as updateBucket does every other
// bucket (description, history, replicas, roll-ups off), except its expiry, which it sets the
// way ensureStream sets a stream's limits: an expiry an operator changed on the bucket's stream
// is kept. Before, only the expiry was set, so a `worker setup` that raised nats.replicas left
// the bucket holding every job's state, spent budget and cancel on the node it was made on. The
// expiry is setup's once setup declared the bucket (boundowner.go): a worker keeps it. The mark
// is in the metadata of the bucket's stream, which is the bucket's (nats.go's
// KeyValueConfig.Metadata), written here with the rest of the stream's update.
func updateStatusBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig, worker bool, log *slog.Logger) error {
	s, err := js.Stream(ctx, statusStream(cfg.Bucket))
	if err != nil {
		return err
	}
	cur := s.CachedInfo().Config
	want := cur
	want.Metadata = maps.Clone(cur.Metadata)
	if want.Metadata == nil {
		want.Metadata = map[string]string{}
	}
	want.Metadata[settingMeta("max_age")] = "nats.status_ttl"
	setBucketFields(&want, cfg)
	want.MaxAge = cfg.TTL
	if worker {
		ownBounds(ctx, log, statusBounds, cur, &want, true)
	} else {
		markSetups(&want)
	}
	earlier := want
	earlier.MaxAge = 0
	_, err = ensureStream(ctx, js, want, earlier, log)
	return err
}

// declareBucket creates a missing bucket and brings an existing one to cfg, with roll-ups off
// either way (see allowRollups). An existing bucket is updated as the stream it is, never through
// nats.go's bucket update, which turns roll-ups back on: until they were off again, a writer of
// one key could purge every tenant's keys, and an attacker publishing roll-ups in a loop would
// meet that moment at the next `worker setup` or start of a worker that declares. A bucket just
// created holds no key, so the moment before updateBucket there has nothing to purge.
func declareBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, cfg.Bucket) // another worker made it first
		}
	}
	if err != nil {
		return nil, err
	}
	return kv, updateBucket(ctx, js, cfg)
}

// updateBucket sets what Boxcar's bucket configs set (description, history, expiry, replicas)
// on the bucket's stream, with roll-ups off, when any of it differs.
func updateBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) error {
	s, err := js.Stream(ctx, statusStream(cfg.Bucket))
	if err != nil {
		return fmt.Errorf("queue: look up bucket %s: %w", cfg.Bucket, err)
	}
	cur := s.CachedInfo().Config
	want := cur
	setBucketFields(&want, cfg)
	want.MaxAge = cfg.TTL
	if want.MaxAge > 0 && want.Duplicates > want.MaxAge {
		want.Duplicates = want.MaxAge // the server refuses a duplicate window beyond the expiry
	}
	if reflect.DeepEqual(want, cur) {
		return nil
	}
	if _, err := js.UpdateStream(ctx, want); err != nil {
		return fmt.Errorf("queue: update bucket %s (roll-ups off: while on, a writer of one key can purge every tenant's keys); run `worker setup` with the operator's login: %w", cfg.Bucket, err)
	}
	return nil
}

// setBucketFields sets on a bucket's stream what Boxcar's bucket configs set, but the expiry:
// description, history and replicas, with roll-ups off, and the bounds on its size and on a
// value's where the config sets them (the cancel bucket's, which every tenant writes).
func setBucketFields(sc *jetstream.StreamConfig, cfg jetstream.KeyValueConfig) {
	sc.Description, sc.AllowRollup = cfg.Description, allowRollups
	sc.MaxMsgsPerSubject, sc.Replicas = int64(max(cfg.History, 1)), max(cfg.Replicas, 1)
	if cfg.MaxBytes != 0 {
		sc.MaxBytes = cfg.MaxBytes
	}
	if cfg.MaxValueSize != 0 {
		sc.MaxMsgSize = cfg.MaxValueSize
	}
}

// allowRollups: no stream of Boxcar's allows roll-ups. nats.go makes every bucket allow them (its
// Purge is one), and the server checks a Nats-Rollup header against no subject: an identity
// allowed to write only its tenant's keys or jobs (a submitter's cancel or job, an approver's
// answer) would, with "Nats-Rollup: all" on one of them, purge the whole stream, every tenant's
// keys or jobs. Boxcar purges nothing, so nothing needs a roll-up. ensureStream and
// updateBucket turn them off on every stream they declare.
const allowRollups = false

// setUpStatus creates a status bucket when it is missing, else binds it and brings it to
// the config (updateStatusBucket); worker marks a worker's start, which keeps setup's expiry.
func setUpStatus(ctx context.Context, js jetstream.JetStream, want jetstream.KeyValueConfig, worker bool, log *slog.Logger) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, want.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		created := want
		created.Metadata = map[string]string{setMeta("max_age"): want.TTL.String()}
		kv, err = js.CreateKeyValue(ctx, created)
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, want.Bucket) // another worker made it first
		}
	}
	if err != nil {
		return nil, err
	}
	return kv, updateStatusBucket(ctx, js, want, worker, log)
}

// statusBucketConfig is tenant's status bucket as the config declares it (statusbuckets.go).
func statusBucketConfig(cfg config.NATS, tenant string) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      statusBucket(cfg, tenant),
		Description: "Boxcar job status by tenant.job, of tenant " + tenant,
		// The steps a job went through, for an operator's watch or `nats kv history`
		// (a consumer); a tenant's identity reads only the latest (read.go).
		History: statusHistory,
		// A status expires ttl after its last write: for a job that ended, after it ended.
		TTL:      time.Duration(cfg.StatusTTL),
		Storage:  jetstream.FileStorage,
		Replicas: cfg.Replicas,
	}
}
