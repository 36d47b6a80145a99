// Package provenance owns the record of how a run came about: the manifest (an in-toto
// Statement v1 with a Boxcar predicate) in RFC 8785 canonical JSON, its digests, optional
// ed25519 DSSE signing, and verification of a stored run against it. It does not store
// anything itself and never reads the environment, so a manifest cannot pick up a secret
// that nobody put in it.
package provenance

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"reflect"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	v1 "github.com/in-toto/attestation/go/v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/store"
)

// PredicateType names the Boxcar predicate inside the in-toto statement.
const PredicateType = "https://boxcar.dev/provenance/v1"

// Manifest is the Boxcar predicate: everything that went into one run and how it ended.
// Build fills Profile.Digest when it is empty and reduces Model.EndpointHost to a host.
type Manifest struct {
	Job       Job           `json:"job"`
	Inputs    []Input       `json:"inputs"`
	Profile   Profile       `json:"profile"`
	Sandbox   Sandbox       `json:"sandbox"`
	Model     Model         `json:"model"`
	ToolCalls []ToolCall    `json:"tool_calls"`
	Limits    config.Limits `json:"limits"` // the profile's limits after the job tightened them
	Spent     Spent         `json:"spent"`
	Outcome   Outcome       `json:"outcome"`
	Collected Collected     `json:"collected,omitzero"`
	Timings   Timings       `json:"timings"`
	Attempt   int           `json:"attempt"` // 1 for the first delivery
	Worker    Worker        `json:"worker"`
	// Egress is the job's network traffic through the worker's proxy; absent for a profile
	// without a network.
	Egress *Egress `json:"egress,omitempty"`
	// Tenant is whose job it was and what the tenant was granted, as the worker saw them;
	// absent in runs committed before tenants.
	Tenant Tenant `json:"tenant,omitzero"`
	// Usage is what the attempt used, for accounting; absent in runs committed before it.
	Usage *RunUsage `json:"usage,omitempty"`
}

// RunUsage is what the committing attempt used: each model call's tokens, its tool calls, its
// sandbox's CPU time and peak memory, and the wall time of each phase.
type RunUsage struct {
	ModelCalls []ModelCall `json:"model_calls"`
	ToolCalls  int         `json:"tool_calls"`
	// Sandbox is absent when no sandbox ran (a job that ended before).
	Sandbox *SandboxUsage `json:"sandbox,omitempty"`
	// PhasesMS is the wall time of each phase the attempt went through, in milliseconds:
	// admit, claim, prepare, run, collect, commit (until the manifest was written).
	PhasesMS map[string]int64 `json:"phases_ms"`
}

// ModelCall is one model request that got an answer.
type ModelCall struct {
	Turn             int    `json:"turn"`
	ResponseID       string `json:"response_id"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
	TotalTokens      int64  `json:"total_tokens"`
	// TokensEstimated says the endpoint reported no usage for this answer (or zeros, or
	// negative figures), and the tokens are the worker's estimate from the bytes sent and
	// received, which the job's and the tenant's budgets counted.
	TokensEstimated bool  `json:"tokens_estimated,omitempty"`
	DurationMS      int64 `json:"duration_ms"`
}

// SandboxUsage is what the sandbox's processes used, as its cgroup counted it; a figure the
// host could not count is 0 and named in Missing.
type SandboxUsage struct {
	CPUMS           int64    `json:"cpu_ms"`
	PeakMemoryBytes int64    `json:"peak_memory_bytes"`
	Source          string   `json:"source,omitempty"` // "cgroup v1", "cgroup v2"
	Missing         []string `json:"missing,omitempty"`
}

// Tenant is the job's tenant as the worker took it from the subject the job came on (never
// from the job's JSON), and the grant the worker's config gave the tenant when it ran.
type Tenant struct {
	Name string `json:"name"`
	// Profiles are the profiles granted to the tenant.
	Profiles []string `json:"profiles,omitempty"`
	// DailyTokens is the tenant's model tokens per UTC day; 0 is unlimited.
	DailyTokens int64 `json:"daily_tokens,omitempty"`
	// MaxConcurrent is how many of the tenant's jobs may run at once across the fleet.
	MaxConcurrent int `json:"max_concurrent,omitempty"`
}

// Egress summarises what a job's sandbox reached through the egress proxy. It names the
// secrets used, never their values.
type Egress struct {
	Requests    int64        `json:"requests"`
	Denied      int64        `json:"denied"`
	BytesOut    int64        `json:"bytes_out"`
	BytesIn     int64        `json:"bytes_in"`
	Hosts       []EgressHost `json:"hosts"`
	SecretsUsed []string     `json:"secrets_used,omitempty"`
	// HostsDropped counts the hosts past MaxEgressHosts, the last by name, that Hosts leaves
	// out (their traffic is in the totals above).
	HostsDropped int `json:"hosts_dropped,omitempty"`
	// ClosedUnread counts the connections and requests the proxy closed unread, with no
	// decision, once the job was past its max_requests: attempts Requests leaves out.
	ClosedUnread int64 `json:"closed_unread,omitempty"`
}

// MaxEgressHosts is the most hosts a manifest names: a job reaches as many as its egress'
// max_requests, which has no upper bound, and a reader takes no more than this many; Build
// counts the rest in HostsDropped.
const MaxEgressHosts = 1 << 14

// cutHosts is e with at most MaxEgressHosts hosts, the first by name, and the rest counted.
func cutHosts(e *Egress) *Egress {
	if e == nil || len(e.Hosts) <= MaxEgressHosts {
		return e
	}
	c := *e
	c.Hosts = slices.Clone(e.Hosts)
	slices.SortStableFunc(c.Hosts, func(a, b EgressHost) int { return strings.Compare(a.Host, b.Host) })
	c.HostsDropped += len(c.Hosts) - MaxEgressHosts
	c.Hosts = c.Hosts[:MaxEgressHosts]
	return &c
}

// EgressHost is the traffic to one allowed host.
type EgressHost struct {
	Host     string `json:"host"`
	Requests int64  `json:"requests"`
	BytesOut int64  `json:"bytes_out"`
	BytesIn  int64  `json:"bytes_in"`
}

// Job is the job message as submitted, without its inputs' store URIs.
type Job struct {
	ID          string            `json:"id"`
	Profile     string            `json:"profile"`
	Task        string            `json:"task"`
	Labels      map[string]string `json:"labels,omitempty"`
	SubmittedAt time.Time         `json:"submitted_at"`
	// SubmittedByClaimed is the job's submitted_by: what the submitter wrote, never checked,
	// so no identity; who may submit for a tenant is what NATS enforces (Manifest.Tenant).
	// Runs committed before it was marked as claimed name it submitted_by: Parse reads that
	// into it.
	SubmittedByClaimed string `json:"submitted_by_claimed,omitempty"`
}

// UnmarshalJSON reads a job, taking the submitted_by of a run committed before
// submitted_by_claimed as the claim it always was.
func (j *Job) UnmarshalJSON(data []byte) error {
	type plain Job
	var v struct {
		plain
		SubmittedBy string `json:"submitted_by"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	*j = Job(v.plain)
	if j.SubmittedByClaimed == "" {
		j.SubmittedByClaimed = v.SubmittedBy
	}
	return nil
}

// Input is one input file as the worker checked it.
type Input struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"` // lowercase hex
	Size   int64  `json:"size"`   // bytes
}

// Profile is the execution profile the run used, in full, with its digest.
type Profile struct {
	Name   string         `json:"name"`
	Digest string         `json:"digest"` // "sha256:<hex>" of the canonical JSON of Spec; see ProfileDigest
	Spec   config.Profile `json:"spec"`

	// spec is Spec's canonical JSON when ProfileOf made the profile, which Build writes as
	// it is, and digest its digest, which Build checks Digest against; nil and "" otherwise,
	// and Build encodes Spec and hashes it.
	spec   []byte
	digest string
}

// ProfileOf is the profile of a manifest with Spec's canonical JSON and digest made once: a
// worker builds a manifest on every commit, and a profile's jobs share its spec, so it keeps
// this for them (with the limits it was made with) instead of encoding the spec each time.
// Build writes the spec as encoded here: Spec must not change afterwards.
func ProfileOf(name string, spec config.Profile) (Profile, error) {
	canon, err := canonicalSpec(spec, specDepth)
	if err != nil {
		return Profile{}, fmt.Errorf("provenance: profile %s: %w", name, err)
	}
	digest := specDigest(canon)
	return Profile{Name: name, Digest: digest, Spec: spec, spec: canon, digest: digest}, nil
}

// Sandbox describes where the tools ran.
type Sandbox struct {
	Backend     string `json:"backend"` // bubblewrap or kubernetes
	ID          string `json:"id"`
	Image       string `json:"image,omitempty"`
	ImageDigest string `json:"image_digest,omitempty"`
	CPU         string `json:"cpu"`
	Memory      string `json:"memory"`
	Disk        string `json:"disk"`
	PIDs        int    `json:"pids"`
	Isolation   string `json:"isolation,omitempty"` // e.g. "namespaces, no network" or a runtime class
	// Seccomp names the syscall filter the sandbox's processes ran under and SeccompDigest is
	// the sha256 of the program as loaded; absent where the backend loads none of its own (a
	// pod runs under its runtime's default, which Isolation names).
	Seccomp       string `json:"seccomp,omitempty"`
	SeccompDigest string `json:"seccomp_digest,omitempty"`
	// Warm says the sandbox was started ahead of the job, by a warm pool, and bound to it at
	// ClaimedAt; otherwise it was started for the job, ready at ClaimedAt. Nothing else of a
	// warm sandbox differs from a cold one.
	Warm      bool      `json:"warm"`
	ClaimedAt time.Time `json:"claimed_at,omitzero"`
}

// Model describes the model endpoint and what it was asked and answered.
type Model struct {
	// EndpointHost is the host (and port) of the API, never its path, query or user info.
	EndpointHost string      `json:"endpoint_host"`
	Name         string      `json:"name"`
	Params       ModelParams `json:"params"`
	ResponseIDs  []string    `json:"response_ids"`
	Usage        Usage       `json:"usage"`
}

// ModelParams are the sampling parameters sent with every request.
type ModelParams struct {
	Temperature         *float64 `json:"temperature,omitempty"`
	TopP                *float64 `json:"top_p,omitempty"`
	Seed                *int64   `json:"seed,omitempty"`
	MaxCompletionTokens int64    `json:"max_completion_tokens,omitempty"`
}

// Usage is the token count the endpoint reported, summed over the run.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
	// Estimated says some of the figures are the worker's estimate (ModelCall.TokensEstimated).
	Estimated bool `json:"estimated,omitempty"`
}

// ToolCall is one tool call: its arguments only as a digest, its result as flags.
type ToolCall struct {
	ID         string `json:"id"`
	Tool       string `json:"tool"`
	ArgsSHA256 string `json:"args_sha256"` // lowercase hex of the raw JSON arguments
	ExitCode   int    `json:"exit_code"`
	TimedOut   bool   `json:"timed_out"`
	Truncated  bool   `json:"truncated"`
	Error      string `json:"error,omitempty"`
	DurationMS int64  `json:"duration_ms"`
	// Approval is how the shell policy decided the command; absent for other tools and for
	// shell calls that never reached the policy (invalid arguments).
	Approval Approval `json:"approval,omitzero"`
}

// Approval is how one shell command was decided, as the manifest records it.
type Approval = job.Approval

// Spent is what the job used of its caps (turns, tool calls, tokens): by this attempt, and by
// all attempts so far this one included. Caps count all attempts, so a run capped early in
// a redelivered attempt is explained by AllAttempts.
type Spent struct {
	ThisAttempt Budget `json:"this_attempt"`
	AllAttempts Budget `json:"all_attempts"`
}

// Budget is an amount of the caps: model turns (requests sent), tool calls and tokens.
type Budget struct {
	Turns     int   `json:"turns"`
	ToolCalls int   `json:"tool_calls"`
	Tokens    int64 `json:"tokens"`
}

// Outcome is how the run ended.
type Outcome struct {
	State job.State `json:"state"`
	Cap   string    `json:"cap,omitempty"` // the limit that stopped a capped run
	// Reason is the short machine-readable reason of a failed or dead run, the one its dead
	// letter carries: "report_too_large", "model_rejected", "max_deliveries" …
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
}

// Collected says where the run's report came from when that was not the job's report file,
// and what of the artifact folder was left out; zero when everything was taken as the job
// left it. Whatever the job left in its workdir, the run is committed: a report file that is
// not a regular file inside the workdir, or a folder that cannot be read, is recorded here.
type Collected struct {
	// Report is what report.md holds when it is not the job's report file: "final_message"
	// (the model's last answer), "summary" (the worker's account of a run that did not
	// succeed, followed by whatever the job wrote), "none" (no report.md).
	Report string `json:"report,omitempty"`
	// ReportReason says why: "report_missing", "report_unreadable" (a symlink leading out, a
	// FIFO, a socket, a folder, a loop...), "report_too_large"; ReportError is the detail.
	ReportReason string `json:"report_reason,omitempty"`
	ReportError  string `json:"report_error,omitempty"`
	// Skipped names the files and folders of the artifact folder that were left out, at most
	// 64 of them; SkippedMore counts the rest.
	Skipped     []Skipped `json:"skipped,omitempty"`
	SkippedMore int       `json:"skipped_more,omitempty"`
}

// Skipped is one file or folder of the artifact folder left out of the run.
type Skipped struct {
	Path string `json:"path"`
	// Reason: "too_large", "bad_name", "count_cap", "unreadable" or "changed".
	Reason string `json:"reason"`
	Detail string `json:"detail,omitempty"`
}

// Timings are the run's moments in UTC.
type Timings struct {
	QueuedAt   time.Time `json:"queued_at,omitzero"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	DurationMS int64     `json:"duration_ms"` // Build computes it from StartedAt and FinishedAt when zero
}

// Worker identifies the build that ran the job; see WorkerInfo.
type Worker struct {
	ID          string `json:"id"`
	Version     string `json:"version"`
	VCSRevision string `json:"vcs_revision,omitempty"`
	VCSModified bool   `json:"vcs_modified"`
	GoVersion   string `json:"go_version"`
}

// Subject is a file the manifest vouches for: its name relative to the run's folder
// ("report.md", "artifacts/table.csv", "transcript.jsonl"), SHA-256 and size.
type Subject struct {
	Name   string
	SHA256 string // lowercase hex
	Size   int64  // bytes
	// Path is where the object is stored, relative to the run's folder, when that is not Name:
	// each attempt writes its own folder ("attempts/2-1a2b3c4d/report.md"), so no other
	// attempt can replace what this manifest names. Empty for runs committed before attempt
	// folders. It is the subject's "path" annotation; SubjectKey resolves it.
	Path string
}

// Statement is a parsed manifest.
type Statement struct {
	Subjects  []Subject // sorted by name
	Predicate Manifest
}

// CheckRun returns nil when the statement is the run of job jobID of tenant: the manifest
// records that job, and that tenant, or none in a run committed before tenants, all of whose
// jobs were job.DefaultTenant's. The key a manifest is read from names a job and, by its
// folder, a tenant, but whoever can write there can put any manifest there, a signed run of
// another tenant's among them: only what the manifest records, which its signature covers,
// tells whose run it is. Every reader that takes a manifest as a job's run holds it to this
// (submit verify, get and logs, the worker that adopts a committed run). Otherwise the error
// wraps ErrInvalid.
func (s Statement) CheckRun(tenant, jobID string) error {
	switch {
	case s.Predicate.Job.ID != jobID:
		return fmt.Errorf("%w: it records job %s", ErrInvalid, s.Predicate.Job.ID)
	case s.Tenant() != tenant:
		return fmt.Errorf("%w: it records a job of tenant %s, not of %s", ErrInvalid, s.Tenant(), tenant)
	}
	return nil
}

// Tenant is the tenant whose run the manifest records: job.DefaultTenant for a run committed
// before tenants, which records none.
func (s Statement) Tenant() string {
	if s.Predicate.Tenant.Name == "" {
		return job.DefaultTenant
	}
	return s.Predicate.Tenant.Name
}

// isHexSHA256 reports whether s is a SHA-256 in 64 lowercase hex digits (`^[0-9a-f]{64}$`,
// spelled out: a regexp was a tenth of a manifest's checks).
func isHexSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := range len(s) {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Build returns the manifest as an in-toto Statement v1 in the JSON Canonicalization Scheme
// (RFC 8785; see canonicalJSON): a verifier that canonicalises gets the same bytes back.
// Times are in UTC and subjects sorted by name, so the same manifest and subjects always give
// the same bytes. Errors wrap ErrInvalid.
func Build(m Manifest, subjects []Subject) ([]byte, error) {
	m, err := normalize(m)
	if err != nil {
		return nil, fmt.Errorf("provenance: build: %w", err)
	}
	subjects = slices.Clone(subjects)
	slices.SortFunc(subjects, func(a, b Subject) int { return strings.Compare(a.Name, b.Name) })
	if err := checkSubjects(subjects); err != nil {
		return nil, fmt.Errorf("provenance: build: %w", err)
	}

	// in-toto's own rules on the statement's shape; the predicate is checked by being typed.
	st := &v1.Statement{Type: v1.StatementTypeUri, PredicateType: PredicateType, Predicate: &structpb.Struct{}}
	docs := make([]subjectDoc, len(subjects))
	for i, s := range subjects {
		st.Subject = append(st.Subject, &v1.ResourceDescriptor{Name: s.Name, Digest: map[string]string{"sha256": s.SHA256}})
		docs[i].Name, docs[i].Digest.SHA256 = s.Name, s.SHA256
		docs[i].Annotations.Size, docs[i].Annotations.Path = s.Size, s.Path
	}
	if err := st.Validate(); err != nil {
		return nil, fmt.Errorf("provenance: build: %w: %w", ErrInvalid, err)
	}
	if m.Profile.spec == nil {
		if m.Profile.spec, err = canonicalSpec(m.Profile.Spec, specDepth); err != nil {
			return nil, fmt.Errorf("provenance: build: profile digest: %w", err)
		}
		m.Profile.digest = specDigest(m.Profile.spec)
	}
	digest := m.Profile.digest
	switch m.Profile.Digest {
	case "", digest:
		m.Profile.Digest = digest
	default:
		return nil, fmt.Errorf("provenance: build: %w: profile.digest %s does not match the profile, whose digest is %s", ErrInvalid, m.Profile.Digest, digest)
	}
	out, err := appendStatement(make([]byte, 0, 2*len(m.Profile.spec)+2048), &m, docs)
	if err != nil {
		return nil, fmt.Errorf("provenance: build: encode: %w", err)
	}
	return out, nil
}

// appendStatement writes the in-toto Statement v1 in canonical JSON (appendJCS), with the
// statement's members as protojson names them and the predicate's numbers as encoding/json
// writes them, so that an int64 such as a seed keeps all of its digits. JCS orders the
// members of each object on their own, so the profile's spec goes in as it was encoded.
func appendStatement(out []byte, m *Manifest, subjects []subjectDoc) ([]byte, error) {
	out = append(out, `{"_type":"`+v1.StatementTypeUri+`","predicate":`...)
	// By value, as json.Marshal reads the statement: no field of it is addressable.
	v := reflect.ValueOf(*m)
	plan := structPlanOf(v.Type())
	if plan.longWay {
		return nil, errors.New("predicate: Manifest has a field appendJCS does not write member by member")
	}
	out, err := appendMembers(out, v, plan, func(out []byte, f planField, fv reflect.Value) ([]byte, error) {
		var err error
		if f.name == "profile" {
			out, err = appendProfile(out, m.Profile)
		} else {
			out, err = appendField(out, f, fv, 2)
		}
		if err != nil {
			return nil, fmt.Errorf("predicate.%s: %w", f.name, err)
		}
		return out, nil
	})
	if err != nil {
		return nil, err
	}
	out = append(out, `,"predicateType":"`+PredicateType+`","subject":`...)
	out, err = appendJCS(out, reflect.ValueOf(subjects), 1)
	if err != nil {
		return nil, fmt.Errorf("subject: %w", err)
	}
	return append(out, '}'), nil
}

// appendProfile writes the profile member with its spec as encoded: {"digest","name","spec"},
// in that order.
func appendProfile(out []byte, p Profile) ([]byte, error) {
	out, err := appendJCS(append(out, `{"digest":`...), reflect.ValueOf(p.Digest), specDepth)
	if err != nil {
		return nil, err
	}
	if out, err = appendJCS(append(out, `,"name":`...), reflect.ValueOf(p.Name), specDepth); err != nil {
		return nil, err
	}
	out = append(out, `,"spec":`...)
	out = append(out, p.spec...)
	return append(out, '}'), nil
}

type subjectDoc struct {
	Name   string `json:"name"`
	Digest struct {
		SHA256 string `json:"sha256"`
	} `json:"digest"`
	Annotations struct {
		Size int64  `json:"size"`
		Path string `json:"path,omitempty"`
	} `json:"annotations"`
}

// normalize checks a manifest and puts it in the one form Build encodes.
func normalize(m Manifest) (Manifest, error) {
	if !job.ValidID(m.Job.ID) {
		return m, fmt.Errorf("%w: job.id %q is not a job id", ErrInvalid, m.Job.ID)
	}
	if err := checkInputs(m.Inputs); err != nil {
		return m, err
	}
	m.ToolCalls = slices.Clone(m.ToolCalls) // the UTC times below must not change the caller's
	for i, c := range m.ToolCalls {
		if c.ArgsSHA256 != "" && !isHexSHA256(c.ArgsSHA256) {
			return m, fmt.Errorf("%w: tool_calls[%d].args_sha256 %q is not 64 lowercase hex digits", ErrInvalid, i, c.ArgsSHA256)
		}
		if err := checkApproval(c.Approval); err != nil {
			return m, fmt.Errorf("%w: tool_calls[%d].approval: %w", ErrInvalid, i, err)
		}
		m.ToolCalls[i].Approval.DecidedAt = c.Approval.DecidedAt.UTC()
	}
	m.Model.EndpointHost = EndpointHost(m.Model.EndpointHost)
	m.Egress = cutHosts(m.Egress)
	// null and [] would hash differently for the same run.
	m.Inputs = nonNil(m.Inputs)
	m.ToolCalls = nonNil(m.ToolCalls)
	m.Model.ResponseIDs = nonNil(m.Model.ResponseIDs)
	if len(m.Job.Labels) == 0 {
		m.Job.Labels = nil
	}
	m.Job.SubmittedAt = m.Job.SubmittedAt.UTC()
	t := &m.Timings
	t.QueuedAt, t.StartedAt, t.FinishedAt = t.QueuedAt.UTC(), t.StartedAt.UTC(), t.FinishedAt.UTC()
	if t.DurationMS == 0 && !t.StartedAt.IsZero() && t.FinishedAt.After(t.StartedAt) {
		t.DurationMS = t.FinishedAt.Sub(t.StartedAt).Milliseconds()
	}
	return m, nil
}

// checkApproval wants a known policy and decision, and a person only under "ask": a manifest
// must not claim that someone approved what the policy decided.
func checkApproval(a Approval) error {
	if a == (Approval{}) {
		return nil
	}
	switch a.Policy {
	case config.PolicyDeny, config.PolicyAllowlist, config.PolicyAsk:
	default:
		return fmt.Errorf("policy %q is not deny, allowlist or ask", a.Policy)
	}
	switch a.Decision {
	case job.DecisionApproved, job.DecisionDenied:
	case job.DecisionTimedOut, job.DecisionRefused:
		if a.Policy != config.PolicyAsk {
			return fmt.Errorf("decision %s under policy %s: only ask waits for a person", a.Decision, a.Policy)
		}
	default:
		return fmt.Errorf("decision %q is not approved, denied, timed_out or refused", a.Decision)
	}
	if a.DecidedBy != "" && a.Policy != config.PolicyAsk {
		return fmt.Errorf("decided_by %q under policy %s: only ask has a person decide", a.DecidedBy, a.Policy)
	}
	return nil
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// MaxArtifacts is the most artifacts a worker takes of a run, so the most a manifest names:
// the run's report and transcript are the only other subjects. A manifest naming more is no
// run a worker committed, and each of its names would be a download, a read and a file for
// its readers (get, verify).
const MaxArtifacts = 64

// MaxInputs is the most inputs a job can have, so the most a manifest names: a job message
// is at most job.MaxMessageBytes, and each of its inputs takes minInputBytes of it at least.
// A manifest naming more is no job's run, and each of its inputs would be a read for verify.
const MaxInputs = job.MaxMessageBytes / minInputBytes

// minInputBytes is the smallest input as a job message holds it: a name and a URI of one
// character, the digest, size 0.
const minInputBytes = len(`{"name":"a","uri":"a","sha256":"","size":0}`) + 64

// checkInputs wants at most MaxInputs inputs, each with a hex SHA-256 and a size.
func checkInputs(inputs []Input) error {
	if len(inputs) > MaxInputs {
		return fmt.Errorf("%w: %d inputs; a job holds at most %d", ErrInvalid, len(inputs), MaxInputs)
	}
	for i, in := range inputs {
		if !isHexSHA256(in.SHA256) || in.Size < 0 {
			return fmt.Errorf("%w: inputs[%d] (%s): sha256 must be 64 lowercase hex digits and size at least 0", ErrInvalid, i, in.Name)
		}
	}
	return nil
}

// checkSubjects wants at least one subject and at most MaxArtifacts artifacts, sorted, each a file of a run (runFile) with a hex
// SHA-256 and a size, no name twice, and every path in the same attempt folder (or none, in a
// run from before attempt folders). A reader writes a subject where its name says (get) and
// reads it where its path says: a manifest naming anything else is no run a worker committed,
// signed or not.
func checkSubjects(subjects []Subject) error {
	if len(subjects) == 0 {
		return fmt.Errorf("%w: no subjects; the transcript at least must be named", ErrInvalid)
	}
	artifacts := 0
	for _, s := range subjects {
		if strings.HasPrefix(s.Name, "artifacts/") {
			artifacts++
		}
	}
	if artifacts > MaxArtifacts {
		return fmt.Errorf("%w: %d artifacts; a run names at most %d", ErrInvalid, artifacts, MaxArtifacts)
	}
	folder := attemptOf(subjects[0])
	for i, s := range subjects {
		switch {
		case !runFile(s.Name):
			return fmt.Errorf("%w: subject %q: a run's files are report.md, transcript.jsonl and artifacts/<clean relative path>", ErrInvalid, s.Name)
		case !isHexSHA256(s.SHA256):
			return fmt.Errorf("%w: subject %s: sha256 %q is not 64 lowercase hex digits", ErrInvalid, s.Name, s.SHA256)
		case s.Size < 0:
			return fmt.Errorf("%w: subject %s: size %d is negative", ErrInvalid, s.Name, s.Size)
		case !pathOK(s):
			return fmt.Errorf("%w: subject %s: path %q: a path is attempts/<attempt folder>/ and the subject's name", ErrInvalid, s.Name, s.Path)
		case attemptOf(s) != folder:
			return fmt.Errorf("%w: subject %s: path %q: every subject is in the folder of the attempt that committed, %q", ErrInvalid, s.Name, s.Path, folder)
		case i > 0 && subjects[i-1].Name == s.Name:
			return fmt.Errorf("%w: subject %s appears twice", ErrInvalid, s.Name)
		}
	}
	return nil
}

// pathOK reports whether a subject's path, if any, is attempts/<folder>/ and its name, a key
// the store writes.
func pathOK(s Subject) bool {
	return s.Path == "" || (validName(s.Path) && printable(s.Path) && s.Path == "attempts/"+attemptOf(s)+"/"+s.Name)
}

// runFile reports whether name is one of the files a worker stores of a run: its report, its
// transcript, or an artifact, a clean relative path under artifacts/ of a name a worker takes:
// a key the store writes (no control character, valid UTF-8, no U+FFFE, U+FFFF or backslash)
// without format characters or line separators. A reader prints each name and writes a file
// of it (get): an escape sequence in one would reach the terminal, and a newline forge a line.
func runFile(name string) bool {
	rest, artifact := strings.CutPrefix(name, "artifacts/")
	return name == "report.md" || name == "transcript.jsonl" || (artifact && validName(rest) && printable(name))
}

// printable reports whether a subject's name or path is a key the store writes (no control
// character, valid UTF-8, no U+FFFE, U+FFFF or backslash) without format characters or line
// separators, as every name a worker takes.
func printable(name string) bool {
	return store.WritableKey(name) && !strings.ContainsFunc(name, func(r rune) bool {
		return unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
	})
}

// attemptOf is the attempt folder a subject's path names ("attempts/<folder>/…"), "" for none.
func attemptOf(s Subject) string {
	rest, ok := strings.CutPrefix(s.Path, "attempts/")
	folder, _, found := strings.Cut(rest, "/")
	if !ok || !found {
		return ""
	}
	return folder
}

// validName reports whether name is a relative slash-separated path without empty, "." or
// ".." parts: it cannot climb out of the run's folder.
func validName(name string) bool {
	if name == "" || strings.ContainsRune(name, 0) || strings.Contains(name, `\`) {
		return false
	}
	for part := range strings.SplitSeq(name, "/") {
		if part == "" || part == "." || part == ".." {
			return false
		}
	}
	return true
}

// Parse reads a manifest that Build wrote: an in-toto Statement v1 with the Boxcar predicate.
// The document is held to the shape of a run (checkShape) before it is decoded, so a manifest
// a writer of the store made costs its reader no more than a run's. Errors wrap ErrInvalid.
func Parse(data []byte) (Statement, error) {
	if err := checkShape(data, statementShape); err != nil {
		return Statement{}, fmt.Errorf("provenance: parse: %w", err)
	}
	// The typed view reads numbers exactly and skips what it does not know without holding it.
	var doc struct {
		Type    string `json:"_type"`
		Subject []struct {
			Name        string            `json:"name"`
			Digest      map[string]string `json:"digest"`
			Annotations struct {
				Size *int64 `json:"size"`
				Path string `json:"path"`
			} `json:"annotations"`
		} `json:"subject"`
		PredicateType string   `json:"predicateType"`
		Predicate     Manifest `json:"predicate"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return Statement{}, fmt.Errorf("provenance: parse: %w: %v", ErrInvalid, err)
	}
	// in-toto's own rules on the statement's shape, as Build holds it to them.
	st := &v1.Statement{Type: doc.Type, PredicateType: doc.PredicateType, Predicate: &structpb.Struct{}}
	for _, s := range doc.Subject {
		st.Subject = append(st.Subject, &v1.ResourceDescriptor{Name: s.Name, Digest: s.Digest})
	}
	if err := st.Validate(); err != nil {
		return Statement{}, fmt.Errorf("provenance: parse: %w: %w", ErrInvalid, err)
	}
	if doc.Type != v1.StatementTypeUri {
		return Statement{}, fmt.Errorf("provenance: parse: %w: statement type %q, want %s", ErrInvalid, doc.Type, v1.StatementTypeUri)
	}
	if doc.PredicateType != PredicateType {
		return Statement{}, fmt.Errorf("provenance: parse: %w: predicate type %q, want %s", ErrInvalid, doc.PredicateType, PredicateType)
	}
	out := Statement{Predicate: doc.Predicate}
	for _, s := range doc.Subject {
		if s.Annotations.Size == nil {
			return Statement{}, fmt.Errorf("provenance: parse: %w: subject %s has no size annotation", ErrInvalid, s.Name)
		}
		out.Subjects = append(out.Subjects, Subject{Name: s.Name, SHA256: s.Digest["sha256"], Size: *s.Annotations.Size, Path: s.Annotations.Path})
	}
	slices.SortFunc(out.Subjects, func(a, b Subject) int { return strings.Compare(a.Name, b.Name) })
	if err := checkSubjects(out.Subjects); err != nil {
		return Statement{}, fmt.Errorf("provenance: parse: %w", err)
	}
	if err := checkInputs(out.Predicate.Inputs); err != nil {
		return Statement{}, fmt.Errorf("provenance: parse: %w", err)
	}
	if !job.ValidID(out.Predicate.Job.ID) {
		return Statement{}, fmt.Errorf("provenance: parse: %w: job.id %q is not a job id", ErrInvalid, out.Predicate.Job.ID)
	}
	return out, nil
}

// ProfileDigest returns "sha256:<hex>" of the profile's canonical JSON. Any change to the
// profile (a tool, a limit, the prompt) changes it; map order and white space do not.
func ProfileDigest(p config.Profile) (string, error) {
	digest, err := profileDigest(p)
	if err != nil {
		return "", fmt.Errorf("provenance: profile digest: %w", err)
	}
	return digest, nil
}

func profileDigest(p config.Profile) (string, error) {
	canon, err := canonicalSpec(p, 0)
	if err != nil {
		return "", err
	}
	return specDigest(canon), nil
}

// canonicalSpec is a profile's canonical JSON, what its digest is of, at depth in a document.
func canonicalSpec(p config.Profile, depth int) ([]byte, error) {
	return appendJCS(nil, reflect.ValueOf(p), depth)
}

// specDepth is where a manifest holds its profile's spec: statement.predicate.profile.spec.
const specDepth = 3

func specDigest(canon []byte) string {
	sum := sha256.Sum256(canon)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Digest reads r to its end and returns the lowercase hex SHA-256 and the byte count.
func Digest(r io.Reader) (hexSHA256 string, size int64, err error) {
	h := sha256.New()
	size, err = io.Copy(h, r)
	if err != nil {
		return "", size, fmt.Errorf("provenance: digest: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), size, nil
}

// EndpointHost reduces a model endpoint to its host and port: "https://user:pass@host:8443/v1?k=x"
// becomes "host:8443". A bare host stays as it is.
func EndpointHost(endpoint string) string {
	s := strings.TrimSpace(endpoint)
	if s == "" {
		return ""
	}
	if !strings.Contains(s, "://") {
		s = "//" + s // let url.Parse see an authority
	}
	if u, err := url.Parse(s); err == nil && u.Host != "" {
		return u.Host
	}
	// Unparseable: keep what sits between any user info and the first path, query or
	// fragment character, and nothing else. The user info ends at the last '@', wherever a
	// '/' sits: a password holding one ends the authority early for url.Parse, not for us.
	s = strings.TrimPrefix(s, "//")
	if i := strings.Index(s, "://"); i >= 0 {
		s = s[i+3:]
	}
	if i := strings.LastIndex(s, "@"); i >= 0 {
		s = s[i+1:]
	}
	if i := strings.IndexAny(s, "/?#"); i >= 0 {
		s = s[:i]
	}
	return s
}

// String is the build as `--version` prints it: "v1.2.0 (rev 0123abc, modified) go1.26.8".
func (w Worker) String() string {
	s := w.Version
	if w.VCSRevision != "" {
		rev := w.VCSRevision[:min(len(w.VCSRevision), 12)]
		if w.VCSModified {
			rev += ", modified"
		}
		s += " (rev " + rev + ")"
	}
	return s + " " + w.GoVersion
}

// releaseVersion is the version a release build names (`make build` sets it with
// -ldflags -X to `git describe`); Go's own module version of a local build is "(devel)".
var releaseVersion string

// WorkerInfo describes the running binary for Manifest.Worker: its release version (else its
// module version) and the VCS revision Go stamped into it (absent in tests and with
// -buildvcs=false).
func WorkerInfo(id string) Worker {
	w := thisBuild()
	w.ID = id
	return w
}

// thisBuild is read once: the build information does not change while the binary runs, and
// reading it parses it every time.
var thisBuild = sync.OnceValue(func() Worker {
	w := Worker{Version: "(unknown)", GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	switch {
	case releaseVersion != "":
		w.Version = releaseVersion
	case ok && bi.Main.Version != "":
		w.Version = bi.Main.Version
	}
	if !ok {
		return w
	}
	if bi.GoVersion != "" {
		w.GoVersion = bi.GoVersion
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			w.VCSRevision = s.Value
		case "vcs.modified":
			w.VCSModified = s.Value == "true"
		}
	}
	return w
})
