package queue

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"
)

// Once `worker setup` declared a tenant's job stream, its bounds are setup's: the stream's
// metadata says so (ownerMeta), and a worker that declares at start keeps them, warning when
// its config says otherwise, as it keeps its consumers' max_ack_pending and ack wait
// (boundsOf). Before, each worker set its own config's bounds at its start, so workers whose
// nats.job_max_msgs differed undid setup's, and each other's, silently. Where no setup ran (an
// embedded worker, a fleet whose workers may declare) workers still apply their config, and one
// that changes a bound another worker set says so.
const (
	ownerMeta  = "boxcar.setting.owner"
	ownerSetup = "worker setup"
)

// jobBound is a bound of a job stream, with the metadata key that names its setting.
type jobBound struct {
	name, settingMeta string
	get               func(*jetstream.StreamConfig) int64
}

var jobBounds = []jobBound{
	{"max_msgs", msgsSettingMeta, func(c *jetstream.StreamConfig) int64 { return c.MaxMsgs }},
	{"max_bytes", bytesSettingMeta, func(c *jetstream.StreamConfig) int64 { return c.MaxBytes }},
}

// says is the bound as c holds it, with the setting it comes from where c's metadata names it:
// "100000 (nats.job_max_msgs)".
func (b jobBound) says(c *jetstream.StreamConfig) string {
	v := "unbounded"
	if n := b.get(c); n > 0 {
		v = fmt.Sprint(n)
	}
	if s := c.Metadata[b.settingMeta]; s != "" {
		return v + " (" + s + ")"
	}
	return v
}

// keepBounds sets want's bounds, and the settings they come from, to cur's.
func keepBounds(want *jetstream.StreamConfig, cur jetstream.StreamConfig) {
	want.MaxMsgs, want.MaxBytes = cur.MaxMsgs, cur.MaxBytes
	for _, b := range jobBounds {
		if v, ok := cur.Metadata[b.settingMeta]; ok {
			want.Metadata[b.settingMeta] = v
		}
	}
}

// warnBounds logs, for each bound of a served tenant's existing job stream cur that this
// worker's config (want) gives otherwise, that setup's is kept, or, where no setup ran, that
// this worker changes what another worker set (cur still holds the value Boxcar set last; an
// operator's edit is ensureStream's to keep and say).
func warnBounds(ctx context.Context, log *slog.Logger, tenant string, cur, want jetstream.StreamConfig) {
	setup := cur.Metadata[ownerMeta] == ownerSetup
	for _, b := range jobBounds {
		if b.get(&cur) == b.get(&want) {
			continue
		}
		attrs := []any{"tenant", tenant, "stream", cur.Name, "limit", b.name, "stream_bound", b.says(&cur), "config", b.says(&want)}
		switch {
		case setup:
			log.WarnContext(ctx, "this worker's config bounds the tenant's job stream otherwise than `worker setup` did; keeping setup's (run `worker setup` with the config every worker should have to change it)", attrs...)
		case cur.Metadata[setMeta(b.name)] == fmt.Sprint(b.get(&cur)):
			log.WarnContext(ctx, "changing the tenant's job stream bound another worker, or this one's earlier config, set; workers whose configs differ undo each other's at each start (give them one config, or run `worker setup`, whose bound workers then keep)", attrs...)
		}
	}
}
