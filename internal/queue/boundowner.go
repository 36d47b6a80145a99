package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
)

// Once `worker setup` declared a stream whose bounds Boxcar's config sets (a tenant's job
// stream, the dead-letter stream, the status bucket's stream), its bounds are setup's: the
// stream's metadata says so (ownerMeta), and a worker that declares at start keeps them,
// warning when its config says otherwise, as it keeps its consumers' max_ack_pending and ack
// wait (boundsOf). Before, each worker set its own config's bounds at its start, so workers
// whose nats.job_max_msgs, nats.dead_letter_max_age or nats.status_ttl differed undid setup's,
// and each other's, silently. Where no setup ran (an embedded worker, a fleet whose workers may
// declare) workers still apply their config, and one that changes a bound another worker set
// says so. A bucket's metadata is its stream's (KV_<bucket>), where this is recorded.
const (
	ownerMeta  = "boxcar.setting.owner"
	ownerSetup = "worker setup"
)

// owned is a kind of stream whose bounds are setup's: the limits (rows of streams.go's limits)
// its config sets.
type owned []string

var (
	jobStreamBounds  = owned{"max_msgs", "max_bytes"}
	deadLetterBounds = owned{"max_age", "max_bytes"}
	statusBounds     = owned{"max_age"}
)

// settingMeta is the stream metadata key that names the setting a bound comes from, for the
// warnings here and for a refused submitter (full.go): "nats.job_max_msgs".
func settingMeta(limit string) string { return "boxcar.setting." + limit }

// each calls f with each of o's limits.
func (o owned) each(f func(limit)) {
	for _, l := range limits {
		if slices.Contains(o, l.name) {
			f(l)
		}
	}
}

// says is the bound as c holds it, with the setting it comes from where c's metadata names it:
// "100000 (nats.job_max_msgs)".
func says(l limit, c *jetstream.StreamConfig) string {
	v := l.get(c)
	if v == "-1" || v == "0" || v == "0s" {
		v = "unbounded"
	}
	if s := c.Metadata[settingMeta(l.name)]; s != "" {
		return v + " (" + s + ")"
	}
	return v
}

// ownedStream settles want's bounds of kind o: a setup's (Admin.worker false) marks them
// setup's; a worker's keeps an existing stream's where setup set them, or where the stream is
// not its own to bound (served false: a tenant it keeps without serving), and warns where its
// config says otherwise.
func (a *Admin) ownedStream(ctx context.Context, o owned, want *jetstream.StreamConfig, served bool, attrs ...any) error {
	if !a.worker {
		markSetups(want)
		return nil
	}
	s, err := a.js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("queue: look up stream %s: %w", want.Name, err)
	}
	ownBounds(ctx, a.log, o, s.CachedInfo().Config, want, served, attrs...)
	return nil
}

// markSetups records in want's metadata that its bounds are `worker setup`'s.
func markSetups(want *jetstream.StreamConfig) {
	want.Metadata = maps.Clone(want.Metadata)
	if want.Metadata == nil {
		want.Metadata = map[string]string{}
	}
	want.Metadata[ownerMeta] = ownerSetup
}

// ownBounds is ownedStream's worker side, given the existing stream cur.
func ownBounds(ctx context.Context, log *slog.Logger, o owned, cur jetstream.StreamConfig, want *jetstream.StreamConfig, served bool, attrs ...any) {
	if served {
		warnBounds(ctx, log, o, cur, *want, attrs...)
	}
	if !served || cur.Metadata[ownerMeta] == ownerSetup {
		keepBounds(o, want, cur)
	}
}

// keepBounds sets want's bounds of kind o, and the settings they come from, to cur's.
func keepBounds(o owned, want *jetstream.StreamConfig, cur jetstream.StreamConfig) {
	want.Metadata = maps.Clone(want.Metadata)
	if want.Metadata == nil {
		want.Metadata = map[string]string{}
	}
	o.each(func(l limit) {
		l.set(want, &cur)
		if v, ok := cur.Metadata[settingMeta(l.name)]; ok {
			want.Metadata[settingMeta(l.name)] = v
		}
	})
}

// warnBounds logs, for each bound of kind o of the existing stream cur that this worker's
// config (want) gives otherwise, that setup's is kept, or, where no setup ran, that this
// worker changes what another worker set (cur still holds the value Boxcar set last; an
// operator's edit is ensureStream's to keep and say).
func warnBounds(ctx context.Context, log *slog.Logger, o owned, cur, want jetstream.StreamConfig, attrs ...any) {
	setup := cur.Metadata[ownerMeta] == ownerSetup
	o.each(func(l limit) {
		if l.get(&cur) == l.get(&want) {
			return
		}
		attrs := append(slices.Clone(attrs), "stream", cur.Name, "limit", l.name, "stream_bound", says(l, &cur), "config", says(l, &want))
		switch {
		case setup:
			log.WarnContext(ctx, "this worker's config bounds a stream otherwise than `worker setup` did; keeping setup's (run `worker setup` with the config every worker should have to change it)", attrs...)
		case cur.Metadata[setMeta(l.name)] == l.get(&cur):
			log.WarnContext(ctx, "changing a stream bound another worker, or this one's earlier config, set; workers whose configs differ undo each other's at each start (give them one config, or run `worker setup`, whose bound workers then keep)", attrs...)
		}
	})
}
