package config

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/boxcar-run/boxcar/internal/job"
)

// The names the worker gives JetStream are checked at load, so that a name the server refuses,
// or two keys that name one stream, stop the worker before it starts rather than at `worker
// setup` or at its first job.
var (
	// streamName is what the server takes as a stream's or a consumer's name: no whitespace,
	// '.', '*', '>' or path separator.
	streamName = regexp.MustCompile(`^[^\s.*>/\\]{1,255}$`)
	// kvBucket is what the nats.go client takes as a key-value bucket's name.
	kvBucket = regexp.MustCompile(`^[A-Za-z0-9_-]{1,250}$`)
	// subjectToken is one literal token of a subject: no whitespace, '.' or wildcard.
	subjectToken = regexp.MustCompile(`^[^\s.*>]+$`)
)

// profilesStream is the stream behind queue.ProfilesBucket (BOXCAR_PROFILES), and
// cancelStream the one behind queue.CancelBucket (BOXCAR_CANCEL, the shared cancel bucket an
// older Boxcar made; each tenant's is BOXCAR_CANCEL_<tenant>), which no key of the config names
// but which a stream of the config must not take.
const (
	profilesStream = "KV_BOXCAR_PROFILES"
	cancelStream   = "KV_BOXCAR_CANCEL"
)

// maxTenantName is the longest tenant name (job.ValidTenant), maxJobStream the longest
// nats.stream that leaves room for _<tenant> in a JetStream name, and maxTenantBucket the
// longest nats.status_bucket or nats.approvals_bucket that leaves room for it in a bucket's
// name (the nats.go client's limit; its stream, KV_<bucket>_<tenant>, fits a JetStream name
// then).
const (
	maxTenantName   = 32
	maxJobStream    = 255 - 1 - maxTenantName
	maxTenantBucket = 250 - 1 - maxTenantName
)

// maxReplicas is the most replicas JetStream keeps of a stream.
const maxReplicas = 5

// validateNames reports the names of nats: the server or the client would refuse, and two keys
// that would make or fill one stream.
func (n NATS) validateNames() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Path: "nats." + field, Msg: fmt.Sprintf(format, args...)})
	}
	for _, f := range []struct{ key, name string }{{"stream", n.Stream}, {"dead_letter_stream", n.DeadLetterStream}, {"consumer", n.Consumer}} {
		if !streamName.MatchString(f.name) {
			bad(f.key, "%q is not a JetStream name: no spaces, '.', '*', '>', '/' or '\\', at most 255", f.name)
		}
	}
	for _, f := range []struct{ key, name string }{{"status_bucket", n.StatusBucket}, {"approvals_bucket", n.ApprovalsBucket}} {
		if !kvBucket.MatchString(f.name) {
			bad(f.key, "%q is not a bucket name: letters, digits, '_' and '-'", f.name)
		}
	}
	for _, tok := range strings.Split(n.Subject, ".") {
		if !subjectToken.MatchString(tok) {
			bad("subject", "%q is not a subject without wildcards: tokens of letters, digits, '_' or '-' joined by single dots, such as boxcar.jobs", n.Subject)
			break
		}
	}
	// The dead-letter streams take the subjects under their own names (<dead_letter_stream>.>,
	// and a tenant's <dead_letter_stream>_<tenant>.>): a job subject under them would overlap
	// one, which the server refuses.
	first, _, _ := strings.Cut(n.Subject, ".")
	if tenant, ok := strings.CutPrefix(first, n.DeadLetterStream+"_"); first == n.DeadLetterStream || ok && job.ValidTenant(tenant) {
		bad("subject", "%q begins with %s, the name of a dead-letter stream (the dead_letter_stream, or a tenant's: <dead_letter_stream>_<tenant>), which takes every subject under its name; choose another subject or dead_letter_stream", n.Subject, first)
	}
	streams := map[string]string{profilesStream: "the profiles bucket (BOXCAR_PROFILES)", cancelStream: "the shared cancel bucket (BOXCAR_CANCEL)"}
	for _, f := range []struct{ key, stream string }{
		{"stream", n.Stream}, {"dead_letter_stream", n.DeadLetterStream},
		{"status_bucket", "KV_" + n.StatusBucket}, {"approvals_bucket", "KV_" + n.ApprovalsBucket},
	} {
		if other, ok := streams[f.stream]; ok {
			bad(f.key, "is stored in the stream %s, as %s is; give each its own name", f.stream, other)
			continue
		}
		streams[f.stream] = "nats." + f.key
	}
	n.validateTenantStreams(streams, bad)
	if n.Replicas < 1 || n.Replicas > maxReplicas {
		bad("replicas", "%d is not between 1 and %d, the replicas JetStream keeps of a stream", n.Replicas, maxReplicas)
	}
	return errs
}

// validateTenantStreams checks the names of the tenants' own streams, the job streams
// <stream>_<tenant>, the status and approvals buckets' KV_<bucket>_<tenant>, the
// dead-letter streams <dead_letter_stream>_<tenant> and the cancel buckets'
// KV_BOXCAR_CANCEL_<tenant> (a tenant name has no '_'): each name must leave room for the
// longest tenant name, and no other stream of the config (streams, by name) may be named as a
// tenant's is.
func (n NATS) validateTenantStreams(streams map[string]string, bad func(field, format string, args ...any)) {
	for _, f := range []struct {
		key, name, prefix, what string
		most                    int
	}{
		{"stream", n.Stream, n.Stream, "job stream", maxJobStream},
		{"status_bucket", n.StatusBucket, "KV_" + n.StatusBucket, "status bucket's stream", maxTenantBucket},
		{"approvals_bucket", n.ApprovalsBucket, "KV_" + n.ApprovalsBucket, "approvals bucket's stream", maxTenantBucket},
		{"dead_letter_stream", n.DeadLetterStream, n.DeadLetterStream, "dead-letter stream", maxJobStream},
	} {
		if len(f.name) > f.most {
			bad(f.key, "%q is longer than %d characters: each tenant's is named %s_<tenant>, and a tenant name takes up to %d characters of a JetStream name",
				f.name, f.most, f.name, maxTenantName)
		}
		for name, key := range streams {
			if tenant, ok := strings.CutPrefix(name, f.prefix+"_"); ok && job.ValidTenant(tenant) {
				bad(f.key, "%q makes tenant %s's %s %s, the stream of %s; give them names apart", f.name, tenant, f.what, name, key)
			}
		}
	}
	// The tenants' cancel buckets' names are fixed: a stream of the config named as one is the
	// key at fault.
	for name, key := range streams {
		if tenant, ok := strings.CutPrefix(name, cancelStream+"_"); ok && job.ValidTenant(tenant) {
			bad(strings.TrimPrefix(key, "nats."), "is stored in the stream %s, tenant %s's cancel bucket's (BOXCAR_CANCEL_%s); give it another name", name, tenant, tenant)
		}
	}
}
