// Package queue owns Boxcar's use of NATS JetStream: each tenant's job stream and its durable pull
// consumers, publishing, fetching with ack/nak/term and in-progress heartbeats, the dead-letter
// stream, and the status, approvals and profiles buckets. It knows nothing about sandboxes,
// models or storage.
//
// It is split by role, as NATS permissions split them: an Admin declares the streams, buckets
// and consumers (`worker setup`, or a worker with operator rights at start); a Consumer is what
// a worker uses (fetch and settle jobs, write statuses, ask for approvals, advertise profiles);
// a Client is what `submit` uses (publish, read and watch statuses, cancel, answer approvals).
package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
)

// statusHistory is how many revisions of a job's status the bucket keeps.
const statusHistory = 16

// Ref names one job as the worker knows it: the tenant whose subject it came on and its id
// (unique within the tenant).
type Ref struct {
	Tenant string
	ID     string
}

// key is the job's key in the status and cancel buckets, "T.J": a submitter may be allowed
// "T.>" and nothing else.
func (r Ref) key() string { return r.Tenant + "." + r.ID }

func (r Ref) String() string { return r.key() }

// refOf is the job a status or cancel key names; the zero Ref for a key of another shape.
func refOf(key string) Ref {
	tenant, id, ok := strings.Cut(key, ".")
	if !ok || strings.Contains(id, ".") {
		return Ref{}
	}
	return Ref{Tenant: tenant, ID: id}
}

// tenantsOrDefault is the tenants a worker serves, by name: the config's, or the one tenant
// job.DefaultTenant (a worker before tenants, embedded mode), each with its max_concurrent.
func tenantsOrDefault(cfg config.NATS, tenants map[string]config.Tenant) map[string]int {
	out := map[string]int{}
	for name, t := range tenants {
		out[name] = t.MaxConcurrent
	}
	if len(out) == 0 {
		out[job.DefaultTenant] = 0
	}
	for name, n := range out {
		if n <= 0 {
			out[name] = cfg.MaxAckPending
		}
	}
	return out
}

// jobSubject is where a tenant's job is published: boxcar.jobs.T.J.
func jobSubject(cfg config.NATS, r Ref) string { return cfg.Subject + "." + r.key() }

// tenantFilter is the subjects of one tenant's jobs: boxcar.jobs.T.*.
func tenantFilter(cfg config.NATS, tenant string) string { return cfg.Subject + "." + tenant + ".*" }

// jobStream is the stream of one tenant's jobs: BOXCAR_JOBS_T. Each tenant's queue is bounded
// on its own (nats.job_max_msgs, nats.job_max_bytes), so that one tenant's queued jobs never
// make another's submissions fail. A tenant name is lowercase letters, digits and '-', never
// '_', so the name is a JetStream name (config checks the stream name's length) and no two
// tenants, nor a tenant and the shared stream, share one.
func jobStream(cfg config.NATS, tenant string) string { return cfg.Stream + "_" + tenant }

// JobStream is the name of tenant's job stream, for what names it to an operator.
func JobStream(cfg config.NATS, tenant string) string { return jobStream(cfg, tenant) }

// The shared stream, nats.stream itself, took every tenant's jobs before each tenant had a
// stream of its own. It stays, taking no job (its one subject, sharedSubject, is no tenant's:
// a tenant name has no '_', and no role may publish there): its metadata records the tenants
// `worker setup` retired (retired.go), and until the jobs an older Boxcar queued there are
// all settled, the tenants' consumers on it deliver them (drain.go).
func sharedSubject(cfg config.NATS) string { return cfg.Subject + "._shared" }

// retiredSubject is the one subject of the stream of a tenant `worker setup` retired while
// its jobs ran: no role may publish there, so the stream takes no new job of the tenant while
// its consumer settles those (unserved.go).
func retiredSubject(cfg config.NATS, tenant string) string {
	return cfg.Subject + "._retired." + tenant
}

// consumerName is the durable consumer of one tenant's jobs: boxcar-workers-T.
func consumerName(cfg config.NATS, tenant string) string { return cfg.Consumer + "-" + tenant }

// CancelBucket names the key-value buckets where a submitter asks for a job to be cancelled,
// under "T.J": each tenant's is CancelBucket_T (CancelBucketOf); workers watch them and write
// the outcome to the job's status, which only they write. The bucket named CancelBucket itself
// is where an older Boxcar asked every tenant's, which submitters and workers of this version
// also use while an upgrade runs (cancel.go).
const CancelBucket = "BOXCAR_CANCEL"

// newJetStream is the JetStream context of every handle.
func newJetStream(nc *nats.Conn) (jetstream.JetStream, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("queue: jetstream: %w", err)
	}
	return js, nil
}

// bucket looks up a bucket the operator declared; ErrNotReady when it is missing.
func bucket(ctx context.Context, js jetstream.JetStream, name, what string) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("%w: %s bucket %s does not exist on %s; %s", ErrNotReady, what, name, js.Conn().ConnectedUrlRedacted(), setupHint)
	}
	if err != nil {
		// A timeout is no proof the bucket is missing: a leader election answers nothing.
		return nil, fmt.Errorf("queue: look up %s bucket %s: %w", what, name, err)
	}
	return kv, nil
}

// setupHint says how to declare what a handle found missing.
const setupHint = "start a worker first (`worker --embedded`), or run `worker setup` with an operator identity"

// dlqSubject is where a job's dead letter goes: BOXCAR_DLQ.T.J, with T and J as dlqToken writes
// them. A letter is written only while its subject holds none, so two jobs must never share
// one: the second would end with no trace.
func dlqSubject(cfg config.NATS, r Ref) string {
	return cfg.DeadLetterStream + "." + dlqToken(r.Tenant) + "." + dlqToken(r.ID)
}

// noID is the token of a message that names no tenant or job id; dlqToken writes "~" only
// before two hex digits, so no name has this token.
const noID = "~unknown"

// dlqToken writes a tenant or job id as one subject token, without loss: letters, digits, "-"
// and "_" stay (every valid tenant and job id is made of them, so their letters' subjects are
// their names), and every other byte becomes "~" and its two hex digits ("job*1" is "job~2A1",
// "~" itself "~7E"). Replacing them all with "_" made "job*1" and "job_1" one subject.
func dlqToken(s string) string {
	if s == "" {
		return noID
	}
	var b strings.Builder
	for i := range len(s) {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "~%02X", c)
		}
	}
	return b.String()
}
