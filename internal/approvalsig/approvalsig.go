// Package approvalsig signs a person's answer to an approval request and checks such an answer
// for the worker: the answer is bound to the exact command (the SHA-256 of its argv), to the
// request's revision in the approvals bucket, to the tenant, job and call, and to the request's expiry,
// and it must be signed by an approver key the worker trusts, within the key's dates and for the
// job's tenant when its keyring entry names tenants. It does
// not carry answers; internal/queue does.
package approvalsig

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// PayloadType is the DSSE payload type of a signed decision.
const PayloadType = "application/vnd.boxcar.decision+json"

// Sentinels of a refused answer; every refusal wraps one.
var (
	ErrUnsigned     = errors.New("the answer is not signed")
	ErrBadSignature = errors.New("the answer's signature is by no trusted approver key")
	ErrMismatch     = errors.New("the answer was signed for another request")
	ErrExpired      = errors.New("the answer came after the request expired")
	// ErrKeyOutsideDates: signed by a trusted key at a decided_at outside the key's
	// not_before/not_after (with job.ClockSkew either side), which is no late answer.
	ErrKeyOutsideDates = errors.New("the answer was signed with an approver key outside its dates")
	// ErrKeyNotForTenant: signed by a trusted key whose keyring entry names the tenants it
	// approves for, the job's not among them.
	ErrKeyNotForTenant = errors.New("the answer was signed with an approver key of other tenants")
)

// Statement is what an approver signs.
type Statement struct {
	// Tenant is the job's: a job id is unique within its tenant only, so an answer for one
	// tenant's job must not answer another tenant's job of the same id.
	Tenant     string `json:"tenant"`
	JobID      string `json:"job_id"`
	CallID     string `json:"call_id"`
	ArgvSHA256 string `json:"argv_sha256"`
	// RequestRevision is the approvals bucket's revision of the request answered: an answer
	// to an earlier request under the same key (an earlier attempt) does not answer this one.
	RequestRevision uint64       `json:"request_revision"`
	Decision        job.Decision `json:"decision"`
	Reason          string       `json:"reason,omitempty"`
	DecidedAt       time.Time    `json:"decided_at"`
	ExpiresAt       time.Time    `json:"expires_at"`
}

// ArgvDigest is the hex SHA-256 of argv as a JSON array: one string per argument, so that no
// two commands share a digest.
func ArgvDigest(argv []string) string {
	data, _ := json.Marshal(argv) // a []string always encodes
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

type envelope struct {
	PayloadType string `json:"payloadType"`
	Payload     string `json:"payload"`
	Signatures  []struct {
		Sig string `json:"sig"`
	} `json:"signatures"`
}

// Sign returns the DSSE envelope (JSON) of s signed with key.
func Sign(s Statement, key ed25519.PrivateKey) (string, error) {
	if len(key) != ed25519.PrivateKeySize {
		return "", errors.New("approvalsig: sign: not an ed25519 private key")
	}
	s.DecidedAt, s.ExpiresAt = s.DecidedAt.UTC(), s.ExpiresAt.UTC()
	payload, err := json.Marshal(s)
	if err != nil {
		return "", fmt.Errorf("approvalsig: sign: %w", err)
	}
	env := envelope{PayloadType: PayloadType, Payload: base64.StdEncoding.EncodeToString(payload)}
	env.Signatures = append(env.Signatures, struct {
		Sig string `json:"sig"`
	}{base64.StdEncoding.EncodeToString(ed25519.Sign(key, dsse.PAE(PayloadType, payload)))})
	data, err := json.Marshal(env)
	return string(data), err
}

// Request is what the worker asked, as it knows it: the answer must match every field.
type Request struct {
	Tenant, JobID, CallID string
	Argv                  []string
	// Revision of the request in the approvals bucket, as the worker that asked recorded it;
	// 0 (none known) is answered by nothing, since any answer to any copy of the request would
	// do otherwise.
	Revision  uint64
	ExpiresAt time.Time
}

// Check verifies a signed answer to req with the trusted keys and returns what was signed and
// the key that signed it, whose name is who decided. A refusal wraps one of the sentinels.
func Check(signed string, req Request, ring provenance.Keyring) (Statement, provenance.TrustedKey, error) {
	var none provenance.TrustedKey
	if signed == "" {
		return Statement{}, none, ErrUnsigned
	}
	var env envelope
	if err := json.Unmarshal([]byte(signed), &env); err != nil || env.PayloadType != PayloadType || len(env.Signatures) == 0 {
		return Statement{}, none, fmt.Errorf("%w: not a signed decision", ErrBadSignature)
	}
	payload, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil {
		return Statement{}, none, fmt.Errorf("%w: payload: %v", ErrBadSignature, err)
	}
	var s Statement
	if err := json.Unmarshal(payload, &s); err != nil {
		return Statement{}, none, fmt.Errorf("%w: payload: %v", ErrBadSignature, err)
	}
	pae := dsse.PAE(PayloadType, payload)
	key, err := ring.Match(s.DecidedAt, func(pub ed25519.PublicKey) bool {
		for _, sig := range env.Signatures {
			if b, err := base64.StdEncoding.DecodeString(sig.Sig); err == nil && ed25519.Verify(pub, pae, b) {
				return true
			}
		}
		return false
	})
	switch {
	case errors.Is(err, provenance.ErrKeyNotValid):
		return s, none, fmt.Errorf("%w: %v", ErrKeyOutsideDates, err)
	case err != nil:
		return s, none, fmt.Errorf("%w: %v", ErrBadSignature, err)
	}
	if err := match(s, req); err != nil {
		return s, none, err
	}
	if !key.ForTenant(req.Tenant) {
		return s, none, fmt.Errorf("%w: key %s approves for %s, not for %s", ErrKeyNotForTenant, key.Name, strings.Join(key.Tenants, ", "), req.Tenant)
	}
	return s, key, nil
}

// match compares what was signed with what was asked, field by field.
func match(s Statement, req Request) error {
	for _, f := range []struct {
		what      string
		got, want string
	}{
		{"tenant", s.Tenant, req.Tenant}, {"job", s.JobID, req.JobID}, {"call", s.CallID, req.CallID},
		{"command (argv sha256)", s.ArgvSHA256, ArgvDigest(req.Argv)},
		{"request expiry", s.ExpiresAt.UTC().Format(time.RFC3339Nano), req.ExpiresAt.UTC().Format(time.RFC3339Nano)},
	} {
		if f.got != f.want {
			return fmt.Errorf("%w: %s %s, asked %s", ErrMismatch, f.what, f.got, f.want)
		}
	}
	switch {
	case req.Revision == 0:
		return fmt.Errorf("%w: the request's revision is not known, so no answer is its", ErrMismatch)
	case s.RequestRevision != req.Revision:
		return fmt.Errorf("%w: request revision %d, asked at revision %d (a replayed answer)", ErrMismatch, s.RequestRevision, req.Revision)
	case s.Decision != job.DecisionApproved && s.Decision != job.DecisionDenied:
		return fmt.Errorf("%w: decision %q", ErrMismatch, s.Decision)
	// DecidedAt is the answerer's clock, ExpiresAt the worker's (job.ClockSkew).
	case s.DecidedAt.After(s.ExpiresAt.Add(job.ClockSkew)):
		return fmt.Errorf("%w: decided at %s, the request expired at %s", ErrExpired, s.DecidedAt.Format(time.RFC3339), s.ExpiresAt.Format(time.RFC3339))
	}
	return nil
}

// Signer signs answers of the approvals bucket with key, for queue.DecideApproval.
func Signer(key ed25519.PrivateKey) queue.Signer {
	return func(a queue.Approval) (string, error) {
		return Sign(Statement{
			Tenant: a.Tenant, JobID: a.JobID, CallID: a.CallID, ArgvSHA256: ArgvDigest(a.Argv), RequestRevision: a.Revision,
			Decision: a.Decision, Reason: a.Reason, DecidedAt: a.DecidedAt, ExpiresAt: a.ExpiresAt,
		}, key)
	}
}
