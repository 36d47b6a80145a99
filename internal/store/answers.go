package store

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/aws/smithy-go"
)

// ErrWorkerRefused marks an answer of the store that refuses the worker itself, whatever tenant
// its request was for: its credentials, its clock, its configuration, or the bucket it was
// given (a row of s3Answers). The request stored nothing, and waiting within a job's attempt
// rarely changes that, but it is no tenant's fault: the worker is not ready (/readyz), and its
// attempts wait with their deliveries as for an outage of the store, while the operator
// changes what the error says.
var ErrWorkerRefused = errors.New("the store refuses the worker")

// refusedBy is whose the refusal an S3 answer carries is.
type refusedBy int

const (
	// byFolder: a policy refuses the worker this request (an IAM or bucket policy scoped by
	// prefix or key). Whose that is the store tells from what else it takes: a write the
	// store's own object refuses too is the worker's (refusedWhere); one the tenant's folder's
	// proof of writes refuses too is the tenant's (refusedWrite), one it takes is of the key
	// alone (keyRefused); a read the store's own object takes is of the key (readRefusedWhere).
	byFolder refusedBy = iota + 1
	// byStore: the bucket, or the store's own object in it (ProbeKey), refuses the worker: the
	// tenant's when it is a bucket of the tenant's own (ForTenantBucket), else every tenant's,
	// the worker's.
	byStore
	// byWorker: the worker's credentials, clock or settings: every tenant's alike.
	byWorker
)

// s3Answer is one S3 error code that answers a request without storing anything, whose it is
// and what the operator changes. A code not in s3Answers (a 5xx, SlowDown, a RequestTimeout) is
// transient, and a put it answered after its body was sent may have been stored (PutOnce).
type s3Answer struct {
	code string
	by   refusedBy
	// why says what the answer means and what to change; it follows the server's answer in
	// the error, in the worker's log and /readyz.
	why string
}

// s3Answers is every S3 answer that stores nothing and that waiting within an attempt does not
// change; one row per code. A new one is a row.
var s3Answers = []s3Answer{
	{"AccessDenied", byFolder, "a policy (IAM, the bucket's, a KMS key's) refuses the worker's credentials; grant them what the request needs"},
	// A HEAD's answer has no body, so no code: S3's SDK names it by its status.
	{"Forbidden", byFolder, "the server refused the request (403, whose answer carries no reason): a policy refuses the worker's credentials, or they are not the store's; grant them what the request needs"},
	{"AllAccessDisabled", byStore, "the bucket's owner disabled every access to it; enable it, or give another bucket"},
	{"NoSuchBucket", byStore, "the bucket does not exist (deleted, or misnamed); create it, or correct store.url or tenants.<name>.bucket"},
	{"InvalidBucketName", byStore, "the server does not take the bucket's name; correct store.url or tenants.<name>.bucket"},
	{"InvalidAccessKeyId", byWorker, "the store knows no such access key; correct the worker's AWS_ACCESS_KEY_ID (its AWS profile's key), or create the key"},
	{"SignatureDoesNotMatch", byWorker, "the secret key is not the access key's (or a proxy changed the request); correct the worker's AWS_SECRET_ACCESS_KEY (its AWS profile's)"},
	{"ExpiredToken", byWorker, "the session token expired; renew the worker's AWS_SESSION_TOKEN, or let the SDK get credentials that renew (a role, AWS_PROFILE)"},
	{"InvalidToken", byWorker, "the session token is malformed or invalid; correct the worker's AWS_SESSION_TOKEN, or unset it for long-term keys"},
	{"TokenRefreshRequired", byWorker, "the session token must be renewed; renew the worker's AWS_SESSION_TOKEN, or let the SDK get credentials that renew"},
	{"RequestTimeTooSkewed", byWorker, "the worker's clock is far from the server's; set it right (NTP)"},
	{"AuthorizationHeaderMalformed", byWorker, "the worker signs for another region than the bucket's; set store.region to the bucket's"},
	{"PermanentRedirect", byWorker, "the bucket is at another endpoint or region; set store.region (or the endpoint) to the bucket's"},
	{"AccountProblem", byWorker, "the account of the worker's credentials cannot be used; see to it with the provider"},
	{"NotSignedUp", byWorker, "the account of the worker's credentials is not signed up for S3"},
}

// answerTo is the row of s3Answers the server's answer in err is, if any.
func answerTo(err error) (s3Answer, bool) {
	var api smithy.APIError
	if !errors.As(err, &api) {
		return s3Answer{}, false
	}
	i := slices.IndexFunc(s3Answers, func(a s3Answer) bool { return a.code == api.ErrorCode() })
	if i < 0 {
		return s3Answer{}, false
	}
	return s3Answers[i], true
}

// refusal is an S3 answer of s3Answers that refuses the store or the worker (not a folder):
// ErrWorkerRefused, unless the store is a bucket of the tenant's own (ForTenantBucket), which
// makes a byStore one the tenant's.
type refusal struct {
	err error
	by  refusedBy
	why string
	// submitter: met by a submitter's store (Options.Submitter), said in its words.
	submitter bool
}

// forSubmitter says a why of s3Answers to submit's user: its credentials, its clock, its
// --store, where the worker's are the worker's and the settings of its configuration.
var forSubmitter = strings.NewReplacer(
	"the worker's clock", "this machine's clock",
	"the worker signs", "submit signs",
	"the worker's ", "submit's ",
	"store.url or tenants.<name>.bucket", "--store (BOXCAR_STORE)",
	"store.region (or the endpoint)", "AWS_REGION (or --s3-endpoint)",
	"store.region", "AWS_REGION",
)

func (e *refusal) Error() string {
	why := e.why
	if e.submitter {
		why = forSubmitter.Replace(why)
	}
	return fmt.Sprintf("%v (%s)", e.err, why)
}
func (e *refusal) Unwrap() error        { return e.err }
func (e *refusal) Is(target error) bool { return target == ErrWorkerRefused }

// refusalOf marks err, an S3 client's error, as the refusal its answer is (translate); a
// folder's refusal and any other answer are left as they are.
func refusalOf(err error) error {
	if a, ok := answerTo(err); ok && a.by != byFolder {
		return &refusal{err: err, by: a.by, why: a.why}
	}
	return err
}

// storeRefusal marks a failed proof of the store (Probe) whose answer refuses the worker's
// writes to the store's own object: a policy that leaves out ProbeKey refuses every tenant's
// commits, not one tenant's folder.
func storeRefusal(err error, probeURL string) error {
	if a, ok := answerTo(err); ok && a.by == byFolder {
		return &refusal{err: err, by: byStore, why: fmt.Sprintf("%s; every commit is proven by a write of %s", a.why, probeURL)}
	}
	return err
}

// tookNothing: err is an answer that stored nothing (a refusal, s3Answers) or a request that
// was never sent (no credentials).
func tookNothing(err error) bool {
	return errors.Is(err, ErrWriteRefused) || errors.Is(err, ErrWorkerRefused) || errors.Is(err, ErrCredentials)
}
