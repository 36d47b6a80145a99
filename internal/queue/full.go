package queue

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
)

// ErrFull marks a write a stream refused at one of its limits: a job past the job stream's
// bound (the tenant's max_queued or max_queued_bytes, or nats.job_max_msgs or
// nats.job_max_bytes), a cancel request or approval entry past
// nats.cancel_max_bytes or nats.approvals_max_bytes, or larger than an entry may be. Nothing was stored; retrying at once meets the same limit.
var ErrFull = errors.New("full")

// streamLimit is one limit the server refuses a write at: how its error says so, and what the
// refused submitter reads.
type streamLimit struct {
	code  jetstream.ErrorCode
	words string // in the server's description; "" for any
	what  string // which limit, named by the setting that sets it; %s is the stream's name
	room  string // when there is room again
	// whose says who fills the limit: the tenant's own jobs (its job stream), or every
	// tenant's writes (a bucket).
	whose string
}

// jobStreamLimits are the limits of a tenant's job stream, named by the settings that set
// them (boundSettings).
func jobStreamLimits(msgs, bytes string) []streamLimit {
	return []streamLimit{
		{jsStoreFailed, "maximum messages exceeded", "the job stream %s holds " + msgs + " jobs", jobsEnd, ownQueue},
		{jsStoreFailed, "maximum bytes exceeded", "the job stream %s holds " + bytes + " of jobs", jobsEnd, ownQueue},
	}
}

// boundSettings are the settings that bound tenant's job stream, jobs and bytes: its
// tenants: override where it has one, nats.job_max_msgs and nats.job_max_bytes otherwise.
func boundSettings(tenant string, t config.Tenant) (msgs, bytes string) {
	msgs, bytes = "nats.job_max_msgs", "nats.job_max_bytes"
	if t.MaxQueued > 0 {
		msgs = "tenants." + tenant + ".max_queued"
	}
	if t.MaxQueuedBytes > 0 {
		bytes = "tenants." + tenant + ".max_queued_bytes"
	}
	return msgs, bytes
}

// streamBoundSettings are the settings that bound tenant's job stream as its metadata names
// them; a name that is neither of the tenant's is read as the nats one, so that nothing of the
// metadata but these two names reaches the refusal (an identity that may not read the stream,
// or a stream an older Boxcar made, names none).
func streamBoundSettings(tenant string, stream jetstream.Stream) (msgs, bytes string) {
	msgs, bytes = boundSettings("", config.Tenant{})
	if stream == nil {
		return msgs, bytes
	}
	meta := stream.CachedInfo().Config.Metadata
	own, ownBytes := boundSettings(tenant, config.Tenant{MaxQueued: 1, MaxQueuedBytes: 1})
	if meta[settingMeta("max_msgs")] == own {
		msgs = own
	}
	if meta[settingMeta("max_bytes")] == ownBytes {
		bytes = ownBytes
	}
	return msgs, bytes
}

// cancelLimits and approvalsLimits are the limits of the cancel and approvals buckets. The
// server says a stream is full only in the description of its generic "store failed" error
// (10077, also the one-message-per-subject refusal, subjectFull), so that is what is matched.
var (
	cancelLimits = []streamLimit{
		{jsStoreFailed, "maximum bytes exceeded", "the cancel bucket %s holds nats.cancel_max_bytes of requests", cancelsExpire, shared},
		{jsStoreFailed, "maximum messages exceeded", "the cancel bucket %s holds as many requests as it may", cancelsExpire, shared},
		{jsMessageTooLarge, "", "a cancel request is larger than the bucket %s takes (" + fmt.Sprint(cancelMaxValue) + " bytes)", "", ""},
	}
	approvalsLimits = []streamLimit{
		{jsStoreFailed, "maximum bytes exceeded", "the approvals bucket %s holds nats.approvals_max_bytes of requests and answers", approvalsExpire, shared},
		{jsMessageTooLarge, "", "an approval entry is larger than the bucket %s takes (" + fmt.Sprint(approvalMaxValue) + " bytes)", "", ""},
	}
)

// When a full stream has room again, for the refused to read.
const (
	jobsEnd         = "as jobs end"
	cancelsExpire   = "as requests of ended jobs expire (nats.status_ttl)"
	approvalsExpire = "as entries expire, 7 days after they were written"
	ownQueue        = "a limit of the tenant's own queue (each tenant has its job stream)"
	shared          = "a limit every tenant's writes share"
)

// jsMessageTooLarge is the JetStream error code of a message larger than its stream's
// max_msg_size.
const jsMessageTooLarge jetstream.ErrorCode = 10054

// atLimit is err wrapped in ErrFull with which of limits refused it and what to do, or err as
// it is when none did.
func atLimit(err error, stream string, limits []streamLimit) error {
	var api *jetstream.APIError
	if !errors.As(err, &api) {
		return err
	}
	for _, l := range limits {
		if api.ErrorCode != l.code || !strings.Contains(api.Description, l.words) {
			continue
		}
		if l.room == "" { // no room makes it fit: only something smaller does
			return fmt.Errorf("%w: %s (%w)", ErrFull, fmt.Sprintf(l.what, stream), err)
		}
		return fmt.Errorf("%w: %s, %s; there is room again %s: try again later, or ask the operator to raise it in the worker config and run `worker setup` (%w)",
			ErrFull, fmt.Sprintf(l.what, stream), l.whose, l.room, err)
	}
	return err
}
