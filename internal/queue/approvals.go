package queue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/textcut"
)

// The approvals transport carries the shell tool's "ask" policy. A worker that meets a command
// needing a person's approval puts an Approval in the approvals bucket under
// "<tenant>.<job id>.<call key>" and watches that key. `submit approvals` lists the pending ones;
// `submit approve` and `submit deny` answer with a compare-and-set update, so a request is
// answered once. When the worker stops waiting (the approval timeout passed, or the job
// ended) it marks the request expired, so a late answer is refused instead of being lost
// without a word. No answer means denied.

const (
	// approvalsTTL is how long the bucket keeps a request and its answer, for `submit
	// approvals` and audits; the job's transcript keeps the outcome for good.
	approvalsTTL = 7 * 24 * time.Hour
	// maxApprovalArgvBytes bounds the command of one request.
	maxApprovalArgvBytes = 64 << 10
	// approvalMaxValue bounds an entry of the approvals bucket: a command of
	// maxApprovalArgvBytes, JSON-escaped (up to 6 bytes a byte), with the request's and the
	// answer's other fields.
	approvalMaxValue = 8 * maxApprovalArgvBytes
	// Expirer is the DecidedBy of requests the worker stopped waiting for.
	Expirer = "boxcar"
)

// Approval is one shell command waiting for a person's answer, or answered.
type Approval struct {
	// Tenant and JobID name the job; the key, T.J.C, is what a tenant's permissions cover.
	Tenant      string       `json:"tenant,omitempty"`
	JobID       string       `json:"job_id"`
	CallID      string       `json:"call_id"`
	Argv        []string     `json:"argv"`
	Attempt     int          `json:"attempt,omitempty"`
	Worker      string       `json:"worker,omitempty"`
	RequestedAt time.Time    `json:"requested_at"`
	ExpiresAt   time.Time    `json:"expires_at"`
	Decision    job.Decision `json:"decision,omitempty"`
	DecidedBy   string       `json:"decided_by,omitempty"`
	DecidedAt   time.Time    `json:"decided_at,omitzero"`
	Reason      string       `json:"reason,omitempty"`
	// Signed is the approver's signed decision (internal/approvalsig): the worker trusts an
	// answer only through it, never through Decision and DecidedBy, which any writer of the
	// bucket can set.
	Signed string `json:"signed,omitempty"`
	// Revision is the bucket's revision of the entry as read (not stored): what a signed
	// decision binds the answer to. Given to RequestApproval, the request to go on with.
	Revision uint64 `json:"-"`
}

// Pending reports whether the request still waits for an answer at now, a clock of the one
// who answers: its expiry is the worker's clock, so it is judged with job.ClockSkew in hand.
func (a Approval) Pending(now time.Time) bool {
	return a.Decision == "" && !expiredAt(a, now)
}

// expiredAt reports whether a request is past its expiry at now, a clock other than the
// worker's that set the expiry, by more than job.ClockSkew: a nearer expiry is left to the
// worker, which records the request expired when its own clock says so.
func expiredAt(a Approval, now time.Time) bool {
	return !now.Before(a.ExpiresAt.Add(job.ClockSkew))
}

// approvalsBucket is tenant's approvals bucket: <approvals_bucket>_T (tenantbuckets.go).
func approvalsBucket(cfg config.NATS, tenant string) string {
	return tenantBucket(cfg.ApprovalsBucket, tenant)
}

// ApprovalsBucket is the name of tenant's approvals bucket, for what names it to an operator.
func ApprovalsBucket(cfg config.NATS, tenant string) string { return approvalsBucket(cfg, tenant) }

// approvalsConfig is the settings of the approvals bucket named name, a tenant's or the shared.
func approvalsConfig(cfg config.NATS, name string) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      name,
		Description: "Boxcar shell commands waiting for a person, and the answers",
		History:     1,
		TTL:         approvalsTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		// A tenant's approver writes its bucket, under keys of any id of its tenant:
		// unbounded, one tenant could fill the server's store (as the cancel bucket's).
		MaxBytes:     orUnlimited(cfg.ApprovalsMaxBytes),
		MaxValueSize: approvalMaxValue,
	}
}

// setUpApprovals creates or updates each tenant's approvals bucket, and the shared one where an
// older Boxcar made it: its workers still ask there during an upgrade, and a person answers
// there (Client.DecideApproval). The shared bucket's answered and expired requests are copied
// into their tenants' buckets (moveShared), where a worker of this version that runs the job
// again finds the answer; a pending one stays, its older worker watching it.
func (a *Admin) setUpApprovals(ctx context.Context, tenants []string) error {
	for _, tenant := range tenants {
		want := approvalsConfig(a.cfg, approvalsBucket(a.cfg, tenant))
		if _, err := declareBucket(ctx, a.js, want); err != nil {
			return fmt.Errorf("queue: set up approvals bucket %s of tenant %s: %w", want.Bucket, tenant, err)
		}
	}
	switch _, err := lookupShared(ctx, a.js, statusStream(a.cfg.ApprovalsBucket)); {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("queue: look up the shared approvals bucket %s: %w", a.cfg.ApprovalsBucket, err)
	}
	if _, err := declareBucket(ctx, a.js, approvalsConfig(a.cfg, a.cfg.ApprovalsBucket)); err != nil {
		return fmt.Errorf("queue: update the shared approvals bucket %s: %w", a.cfg.ApprovalsBucket, err)
	}
	return a.moveShared(ctx, newTenantBuckets(a.js, a.cfg.ApprovalsBucket, "approvals"), tenants, answered)
}

// answered reports whether the entry under key is a request that waits for nobody any more:
// approved, denied or expired.
func answered(key string, data []byte) bool {
	a, err := decodeApproval(key, data)
	return err == nil && a.Decision != ""
}

// callToken is a call id that can be a key token as it is; others are hashed.
var callToken = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// approvalKey is "<tenant>.<job id>.<call id>", the call id replaced by "=" and a digest when
// it holds characters a key cannot ("=" never starts a plain call id, so the two cannot
// collide).
func approvalKey(r Ref, callID string) (string, error) {
	jobID := r.ID
	if !job.ValidID(jobID) {
		return "", fmt.Errorf("%w: %q is not a job id", ErrUnknownApproval, jobID)
	}
	if callID == "" {
		return "", fmt.Errorf("%w: the call id is empty", ErrUnknownApproval)
	}
	if callToken.MatchString(callID) {
		return r.key() + "." + callID, nil
	}
	sum := sha256.Sum256([]byte(callID))
	return r.key() + ".=" + hex.EncodeToString(sum[:16]), nil
}

// checkKey is the one rule for everything read from the approvals bucket (listed, watched or
// read to be answered): an entry is the request its key names, or it is refused. Anyone who may
// write a tenant's approvals (an approver's NATS login, which the worker does not trust to
// approve) can put any body under any of the tenant's keys; one naming another request than
// its key would be listed, and so answered and signed, as that other request.
func (a Approval) checkKey(key string) error {
	if want, err := approvalKey(Ref{Tenant: a.Tenant, ID: a.JobID}, a.CallID); err == nil && want == key {
		return nil
	}
	return fmt.Errorf("%w: %s holds a request of tenant %s, job %s, call %s; no worker writes that: "+
		"delete the key and find out who may write the tenant's approvals", ErrMisfiledApproval, key, shortQuote(a.Tenant), shortQuote(a.JobID), shortQuote(a.CallID))
}

// shortQuote quotes what a body claims for a message: escaped, and cut, as anyone wrote it.
func shortQuote(s string) string {
	const most = 80
	if len(s) > most {
		s = textcut.Head(s, most) + "…"
	}
	return strconv.Quote(s)
}

// RequestApproval records a command waiting for a person and returns what the bucket holds
// for it. When a person already approved or denied the same command for the same job and call
// id (a redelivered job asking again), that answer is returned and nothing is written. When
// a.Revision is set, the revision of the request an earlier delivery of the job asked and left
// pending when it was handed back (job.Status.Asked), and the key still holds that request for
// the same command, it is kept and returned as it is, pending, with its own expiry. Any other
// earlier request under the key is replaced.
func (c *Consumer) RequestApproval(ctx context.Context, a Approval) (Approval, error) {
	key, err := approvalKey(Ref{Tenant: a.Tenant, ID: a.JobID}, a.CallID)
	if err != nil {
		return Approval{}, err
	}
	size := 0
	for _, arg := range a.Argv {
		size += len(arg) + 1
	}
	switch {
	case len(a.Argv) == 0:
		return Approval{}, errors.New("queue: request approval: the command is empty")
	case size > maxApprovalArgvBytes:
		return Approval{}, fmt.Errorf("queue: request approval: the command is %d bytes, more than the %d a person can be asked about", size, maxApprovalArgvBytes)
	case !a.ExpiresAt.After(a.RequestedAt):
		return Approval{}, errors.New("queue: request approval: ExpiresAt must be after RequestedAt")
	}
	a.Decision, a.DecidedBy, a.DecidedAt, a.Reason, a.Signed = "", "", time.Time{}, "", ""
	kv, err := c.approvals.of(ctx, a.Tenant)
	if err != nil {
		return Approval{}, fmt.Errorf("queue: request approval %s: %w", key, err)
	}
	// An older worker of an upgrade may have asked for this job before: its answer stands. It is
	// waited for while the shared bucket answers nobody, within the approval's time (ctx).
	if err := c.approvals.adoptWaiting(ctx, kv, key); err != nil {
		return Approval{}, fmt.Errorf("queue: request approval %s: %w", key, err)
	}
	got, rev, err := update(ctx, kv, key, guess[Approval]{}, func(old *Approval, rev uint64) (bool, error) {
		if rev > 0 && keeps(*old, rev, a) {
			return false, nil
		}
		*old = a
		return true, nil
	})
	if err != nil {
		return Approval{}, fmt.Errorf("queue: request approval %s: %w", key, atLimit(err, kv.Bucket(), approvalsLimits))
	}
	got.Revision = rev
	return got, nil
}

// keeps reports whether the request under a key, old at revision rev, stands when a is asked:
// answered already for the same command, or still pending for it as its worker asked it, at
// the revision a names.
func keeps(old Approval, rev uint64, a Approval) bool {
	if !slices.Equal(old.Argv, a.Argv) {
		return false
	}
	switch old.Decision {
	case job.DecisionApproved, job.DecisionDenied:
		return true
	case "":
		return rev == a.Revision
	}
	return false
}

// WaitApproval waits until the request is answered (approved, denied or expired) and returns
// it. It returns ctx's error when ctx ends first.
func (c *Consumer) WaitApproval(ctx context.Context, r Ref, callID string) (Approval, error) {
	key, err := approvalKey(r, callID)
	if err != nil {
		return Approval{}, err
	}
	kv, err := c.approvals.of(ctx, r.Tenant)
	if err != nil {
		return Approval{}, fmt.Errorf("queue: watch approval %s: %w", key, err)
	}
	w, err := kv.Watch(ctx, key)
	if err != nil {
		return Approval{}, fmt.Errorf("queue: watch approval %s: %w", key, err)
	}
	defer w.Stop() //nolint:errcheck // nothing to do about it
	for {
		select {
		case <-ctx.Done():
			return Approval{}, ctx.Err()
		case e, ok := <-w.Updates():
			switch {
			case !ok && ctx.Err() != nil:
				return Approval{}, ctx.Err()
			case !ok:
				return Approval{}, fmt.Errorf("queue: watch approval %s: the watch ended", key)
			case e == nil || e.Operation() != jetstream.KeyValuePut:
				continue // nil marks the end of the initial value
			}
			// An entry that is not this request's (checkKey) is not its answer either.
			if a, err := decodeApproval(key, e.Value()); err == nil && a.Decision != "" {
				a.Revision = e.Revision()
				return a, nil
			}
		}
	}
}

// ExpireApproval marks a request nobody answered as expired, with the reason, and returns what
// the bucket holds: the expired request, or the answer a person gave just before.
func (c *Consumer) ExpireApproval(ctx context.Context, r Ref, callID, reason string) (Approval, error) {
	kv, err := c.approvals.of(ctx, r.Tenant)
	if err != nil {
		return Approval{}, fmt.Errorf("queue: expire approval of %s: %w", r, err)
	}
	return updateApproval(ctx, kv, r, callID, func(a *Approval, now time.Time) (bool, error) {
		if a.Decision != "" {
			return false, nil
		}
		a.Decision, a.DecidedBy, a.DecidedAt, a.Reason = job.DecisionExpired, Expirer, now, reason
		return true, nil
	})
}

// Signer signs an answer: it gets the request with the decision filled in and its Revision
// that of the request answered, and returns the signed decision (internal/approvalsig).
type Signer func(Approval) (string, error)

// DecideApproval answers a pending request, once: rev, unless 0, is the revision of the request
// the person was shown (Approval, PendingApprovals), and the answer is refused when the key
// holds another; d is job.DecisionApproved or job.DecisionDenied, by names the person as they
// claim (the worker records the name of the key that signed), reason is optional, sign signs
// the answer (nil leaves it unsigned, which a worker refuses). It fails with
// ErrUnknownApproval, ErrAlreadyDecided, ErrApprovalExpired, ErrApprovalChanged or
// ErrMisfiledApproval, each error saying what the request holds.
func (c *Client) DecideApproval(ctx context.Context, jobID, callID string, rev uint64, d job.Decision, by, reason string, sign Signer) (Approval, error) {
	if d != job.DecisionApproved && d != job.DecisionDenied {
		return Approval{}, fmt.Errorf("queue: decide approval: %q is not approved or denied", d)
	}
	key, err := approvalKey(c.ref(jobID), callID)
	if err != nil {
		return Approval{}, err
	}
	kv, err := c.approvalOf(ctx, key)
	if err != nil {
		return Approval{}, err
	}
	var out Approval
	err = unlessRefused(ctx, c.js.Conn(), []string{"$KV." + kv.bucket + ".>"}, func(ctx context.Context) error {
		var err error
		out, err = c.decide(ctx, kv, jobID, callID, rev, d, by, reason, sign)
		return atLimit(err, kv.bucket, approvalsLimits)
	})
	return out, err
}

// approvalAt is the bucket a request is in: its tenant's, or, for one an older worker asked
// during an upgrade, the shared one, which that worker watches for the answer and where a
// person of the tenant may read and write the request's key alone (sharedBucket).
type approvalAt struct {
	casStore
	bucket string
}

// approvalOf is where the request under key is: the tenant's bucket unless only the shared one
// holds it.
func (c *Client) approvalOf(ctx context.Context, key string) (approvalAt, error) {
	kv, err := c.approvalsBucket(ctx)
	if err != nil {
		return approvalAt{}, err
	}
	_, err = kv.Get(ctx, key)
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return approvalAt{casStore: kv, bucket: kv.Bucket()}, nil // an error: update reads it again
	}
	switch _, err := c.sharedApprovals.Get(ctx, key); {
	case err == nil:
		return approvalAt{casStore: c.sharedApprovals, bucket: c.cfg.ApprovalsBucket}, nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return approvalAt{casStore: kv, bucket: kv.Bucket()}, nil
	default:
		return approvalAt{}, err
	}
}

// decide writes the answer to a request that waits for one. What is signed is the entry
// under the key of the request the person asked to answer, which names that request
// (checkKey), at the revision they were shown when they gave one.
func (c *Client) decide(ctx context.Context, kv casStore, jobID, callID string, rev uint64, d job.Decision, by, reason string, sign Signer) (Approval, error) {
	return updateApproval(ctx, kv, c.ref(jobID), callID, func(a *Approval, now time.Time) (bool, error) {
		if err := answerable(*a, rev, now); err != nil {
			return false, err
		}
		a.Decision, a.DecidedBy, a.DecidedAt, a.Reason = d, by, now, reason
		if sign != nil {
			signed, err := sign(*a)
			if err != nil {
				return false, fmt.Errorf("queue: sign the answer: %w", err)
			}
			a.Signed = signed
		}
		return true, nil
	})
}

// answerable says why request a, read at now, cannot take an answer bound to revision rev (0:
// any), if it cannot: a refusal is a row here.
func answerable(a Approval, rev uint64, now time.Time) error {
	switch {
	case a.Decision == job.DecisionExpired:
		return fmt.Errorf("%w: call %s of job %s expired at %s (%s); the command was denied",
			ErrApprovalExpired, a.CallID, a.JobID, a.DecidedAt.Format(time.RFC3339), a.Reason)
	case a.Decision != "":
		return fmt.Errorf("%w: call %s of job %s was already %s by %s at %s",
			ErrAlreadyDecided, a.CallID, a.JobID, a.Decision, a.DecidedBy, a.DecidedAt.Format(time.RFC3339))
	case rev != 0 && a.Revision != rev:
		return fmt.Errorf("%w: call %s of job %s is at revision %d, not %d: list it again (`submit approvals %s`) and answer what it shows now",
			ErrApprovalChanged, a.CallID, a.JobID, a.Revision, rev, a.JobID)
	case expiredAt(a, now):
		return fmt.Errorf("%w: call %s of job %s expired at %s; the command was denied",
			ErrApprovalExpired, a.CallID, a.JobID, a.ExpiresAt.Format(time.RFC3339))
	}
	return nil
}

// updateApproval applies change to a request that exists with compare-and-set, retrying on a
// concurrent writer. change reports whether it changed anything; if not, nothing is written.
func updateApproval(ctx context.Context, kv casStore, r Ref, callID string, change func(*Approval, time.Time) (bool, error)) (Approval, error) {
	jobID := r.ID
	key, err := approvalKey(r, callID)
	if err != nil {
		return Approval{}, err
	}
	a, rev, err := update(ctx, kv, key, guess[Approval]{}, func(a *Approval, rev uint64) (bool, error) {
		if rev == 0 {
			return false, fmt.Errorf("%w: call %s of job %s (see `submit approvals`)", ErrUnknownApproval, callID, jobID)
		}
		a.Revision = rev
		return change(a, time.Now().UTC())
	})
	if err != nil {
		return a, err
	}
	a.Revision = rev
	return a, nil
}

// approvalsBucket looks the tenant's approvals bucket up for a client. An identity the server
// does not let look it up (credentials generated before each tenant had its own) is told so at
// once.
func (c *Client) approvalsBucket(ctx context.Context) (jetstream.KeyValue, error) {
	name := approvalsBucket(c.cfg, c.tenant)
	var kv jetstream.KeyValue
	err := unlessRefused(ctx, c.js.Conn(), []string{"$JS.API.STREAM.INFO." + statusStream(name)}, func(ctx context.Context) error {
		var err error
		kv, err = bucket(ctx, c.js, name, "approvals")
		return err
	})
	return kv, err
}

// Approval reads the request of a job's call as the key holds it now, answered or not, with
// its revision: what `submit approve` shows before it signs, and binds the answer to.
func (c *Client) Approval(ctx context.Context, jobID, callID string) (Approval, error) {
	key, err := approvalKey(c.ref(jobID), callID)
	if err != nil {
		return Approval{}, err
	}
	kv, err := c.approvalsBucket(ctx)
	if err != nil {
		return Approval{}, err
	}
	a, rev, err := read[Approval](ctx, bucketReader{KeyValue: kv, shared: c.sharedApprovals}, key)
	switch {
	case err != nil:
		return Approval{}, err
	case rev == 0:
		return Approval{}, fmt.Errorf("%w: call %s of job %s (see `submit approvals`)", ErrUnknownApproval, callID, jobID)
	}
	a.Revision = rev
	return a, nil
}

// SkippedApproval is an entry a listing left out, and why: a body that does not decode, or
// that names another request than its key (ErrMisfiledApproval).
type SkippedApproval struct {
	Key   string `json:"key"`
	Error string `json:"error"`
}

// PendingApprovals returns the requests still waiting for an answer, oldest first (with a job
// id, only that job's), and the entries it left out because they cannot be the request their
// key names: whoever lists should say so, as someone who may write the bucket wrote them.
func (c *Client) PendingApprovals(ctx context.Context, jobID string) ([]Approval, []SkippedApproval, error) {
	filter := c.tenant + ".*.*"
	if jobID != "" {
		if !job.ValidID(jobID) {
			return nil, nil, fmt.Errorf("%w: %q is not a job id", ErrUnknownJob, jobID)
		}
		filter = c.ref(jobID).key() + ".*"
	}
	kv, err := c.approvalsBucket(ctx)
	if err != nil {
		return nil, nil, err
	}
	// Listed and read by direct gets, not watched: a tenant's identity creates no consumer.
	entries, err := listEntries(ctx, c.js, kv, filter)
	if err != nil {
		return nil, nil, fmt.Errorf("queue: list approvals: %w", err)
	}
	now := time.Now().UTC()
	var out []Approval
	var skipped []SkippedApproval
	for _, e := range entries {
		a, err := decodeApproval(e.Key(), e.Value())
		switch {
		case err != nil:
			skipped = append(skipped, SkippedApproval{Key: e.Key(), Error: err.Error()})
		case a.Pending(now):
			a.Revision = e.Revision()
			out = append(out, a)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].RequestedAt.Before(out[j].RequestedAt) })
	return out, skipped, nil
}

// decodeApproval decodes the entry under key, held to the key (checkKey).
func decodeApproval(key string, data []byte) (Approval, error) {
	var a Approval
	if err := json.Unmarshal(data, &a); err != nil {
		return Approval{}, fmt.Errorf("queue: decode approval %s: %w", key, err)
	}
	if err := a.checkKey(key); err != nil {
		return Approval{}, err
	}
	return a, nil
}
