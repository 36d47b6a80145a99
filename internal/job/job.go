// Package job owns the job message: its type, strict decoding, validation and ids.
// It knows nothing about queues, sandboxes, models or storage.
package job

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Version is the job message version this build understands.
const Version = 1

// MaxMessageBytes bounds an encoded job; inputs travel through the store, never inside it.
const MaxMessageBytes = 64 << 10

// Job is one unit of work: a task for an agent over a set of input files.
type Job struct {
	Version     int               `json:"version"`
	ID          string            `json:"id"`
	Profile     string            `json:"profile"`
	Task        string            `json:"task"`
	Inputs      []Input           `json:"inputs,omitempty"`
	Limits      *Limits           `json:"limits,omitempty"`
	Network     *Network          `json:"network,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	SubmittedAt time.Time         `json:"submitted_at"`
	SubmittedBy string            `json:"submitted_by,omitempty"`
	// Tenant is who the job belongs to. The worker overwrites it from the subject the message
	// came on (the tenant the server let the submitter publish as), so a value in the payload
	// is a claim, never an identity. Empty means DefaultTenant.
	Tenant string `json:"tenant,omitempty"`
}

// DefaultTenant is the tenant of a worker without a tenants: section, of embedded mode, and of
// a job that names none.
const DefaultTenant = "default"

// Input is a file the job works on. URI points into the store; SHA256 and Size are checked
// when the worker copies it into the sandbox.
type Input struct {
	Name   string `json:"name"`
	URI    string `json:"uri"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// MinJobTimeout is the shortest limits.job_timeout a job may ask for. The same time bounds
// what comes before the run (the claim, the sandbox's start, the inputs' copy), so a job that
// asked for less could never start: its deliveries ran out on "context deadline exceeded",
// each a transient fault, and it ended dead instead of being refused with the reason.
const MinJobTimeout = time.Second

// Limits may only tighten the profile's limits; zero means "the profile's value".
type Limits struct {
	MaxTurns       int      `json:"max_turns,omitempty"`
	MaxToolCalls   int      `json:"max_tool_calls,omitempty"`
	MaxTokens      int64    `json:"max_tokens,omitempty"`
	JobTimeout     Duration `json:"job_timeout,omitempty"`
	CommandTimeout Duration `json:"command_timeout,omitempty"`
}

// UnmarshalJSON reads the limits strictly (unknown keys refused) and names the key of a
// duration that does not read: encoding/json passes a Duration's error on without its key, and
// "time: invalid duration" alone leaves the submitter to guess which of the two it was.
func (l *Limits) UnmarshalJSON(data []byte) error {
	type plain Limits // without this method
	var raw struct {
		plain
		JobTimeout     json.RawMessage `json:"job_timeout,omitempty"`
		CommandTimeout json.RawMessage `json:"command_timeout,omitempty"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return err
	}
	*l = Limits(raw.plain)
	for _, d := range []struct {
		key string
		raw json.RawMessage
		to  *Duration
	}{{"job_timeout", raw.JobTimeout, &l.JobTimeout}, {"command_timeout", raw.CommandTimeout, &l.CommandTimeout}} {
		if d.raw == nil {
			continue
		}
		if err := d.to.UnmarshalJSON(d.raw); err != nil {
			return fmt.Errorf("limits.%s: %w", d.key, err)
		}
	}
	return nil
}

// Network may only narrow the profile's network: each entry of Allow must be within the
// profile's network.allow (the same forms: host, host:port, *.suffix); the worker rejects a job
// that asks for more. Nil means the profile's network as it is; an empty Allow, none.
type Network struct {
	Allow []string `json:"allow"`
}

// maxAllow bounds a job's allow list: a narrowing needs few entries.
const maxAllow = 64

var (
	namePattern  = regexp.MustCompile(NamePattern)
	sha256Hex    = regexp.MustCompile(`^[0-9a-f]{64}$`)
	labelPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._/-]{0,62}$`)
	// tenantPattern makes a tenant name a NATS subject token, a path segment and a label value.
	tenantPattern = regexp.MustCompile(TenantPattern)
)

// NamePattern is the rule a profile name and an input's name follow: a letter or digit, then
// letters, digits, '.', '_' and '-', 128 at most. The config refuses a profile whose name
// breaks it (no job could name that profile) and the schemas say the same.
const NamePattern = `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`

// ValidProfileName reports whether name is a profile name a job can give.
func ValidProfileName(name string) bool { return namePattern.MatchString(name) }

// TenantPattern is the rule a tenant name follows, for schemas and config validation.
const TenantPattern = `^[a-z0-9][a-z0-9-]{0,31}$`

// TenantRule says TenantPattern in words, for the errors that refuse a name.
const TenantRule = "lowercase letters, digits and '-', 1 to 32 characters, starting with a letter or digit"

// ValidTenant reports whether name is a well-formed tenant name.
func ValidTenant(name string) bool { return tenantPattern.MatchString(name) }

// TenantOrDefault returns the job's tenant, DefaultTenant when it names none.
func (j Job) TenantOrDefault() string {
	if j.Tenant == "" {
		return DefaultTenant
	}
	return j.Tenant
}

// NewID returns a fresh job id: time-ordered, lowercase, safe as a path segment, an object key,
// a NATS message id and a Kubernetes label value.
func NewID() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return fmt.Sprintf("%s-%x", time.Now().UTC().Format("20060102t150405"), b)
}

// SeqIDPrefix begins the id a worker records a rejected message under when its subject names
// no usable job id: stream-seq-N, N its sequence in the job stream. No job may take such an
// id, so that a job's status and a rejected message's never share a key.
const SeqIDPrefix = "stream-seq-"

// SeqID is the id of the message at seq in the job stream (SeqIDPrefix).
func SeqID(seq uint64) string { return SeqIDPrefix + strconv.FormatUint(seq, 10) }

// ValidID reports whether id is a well-formed job id: ^[a-z0-9][a-z0-9-]{7,63}$. It is
// written out rather than a regexp because a worker checks every job's id several times.
func ValidID(id string) bool {
	if len(id) < 8 || len(id) > 64 || id[0] == '-' {
		return false
	}
	for i := range len(id) {
		if c := id[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// Decode parses and validates one job message. Unknown fields, a key given twice or spelled
// in another case, bytes that are not UTF-8, oversize messages and invalid values are rejected
// with an error wrapping ErrInvalid.
func Decode(data []byte) (Job, error) {
	if len(data) > MaxMessageBytes {
		return Job{}, fmt.Errorf("%w: message is %d bytes, limit is %d", ErrInvalid, len(data), MaxMessageBytes)
	}
	if err := checkBytes(data); err != nil {
		return Job{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var j Job
	if err := dec.Decode(&j); err != nil {
		return Job{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Job{}, fmt.Errorf("%w: trailing data after the job object", ErrInvalid)
	}
	if err := checkEscapes(data); err != nil {
		return Job{}, err
	}
	if err := exactKeys(data); err != nil {
		return Job{}, err
	}
	if err := j.Validate(); err != nil {
		return Job{}, err
	}
	return j, nil
}

// Encode returns the job as JSON, checking it first.
func (j Job) Encode() ([]byte, error) {
	if err := j.Validate(); err != nil {
		return nil, err
	}
	data, err := json.Marshal(j)
	if err != nil {
		return nil, fmt.Errorf("job: encode: %w", err)
	}
	if len(data) > MaxMessageBytes {
		return nil, fmt.Errorf("%w: message is %d bytes, limit is %d; put large text in an input file", ErrInvalid, len(data), MaxMessageBytes)
	}
	return data, nil
}

// bad is the error of a field that is wrong.
func bad(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalid, field, fmt.Sprintf(format, args...))
}

// Validate checks every field and names the first one that is wrong.
func (j Job) Validate() error {
	if j.Version != Version {
		return bad("version", "got %d, this worker understands %d", j.Version, Version)
	}
	if !ValidID(j.ID) {
		return bad("id", "%q is not a job id (lowercase letters, digits and '-', 8 to 64 characters)", j.ID)
	}
	if strings.HasPrefix(j.ID, SeqIDPrefix) {
		return bad("id", "%q begins with %q, which names a rejected message by its stream sequence; choose another id", j.ID, SeqIDPrefix)
	}
	if !ValidProfileName(j.Profile) {
		return bad("profile", "%q is not a profile name", j.Profile)
	}
	if j.Tenant != "" && !ValidTenant(j.Tenant) {
		return bad("tenant", "%q is not a tenant name (%s)", j.Tenant, TenantRule)
	}
	if strings.TrimSpace(j.Task) == "" {
		return bad("task", "is empty")
	}
	if j.SubmittedAt.IsZero() {
		return bad("submitted_at", "is missing")
	}
	if err := validateInputs(j.Inputs); err != nil {
		return err
	}
	if l := j.Limits; l != nil {
		if l.MaxTurns < 0 || l.MaxToolCalls < 0 || l.MaxTokens < 0 || l.JobTimeout < 0 || l.CommandTimeout < 0 {
			return bad("limits", "values may not be negative")
		}
		if t := l.JobTimeout.Std(); t > 0 && t < MinJobTimeout {
			return bad("limits.job_timeout", "%s is below %s, the least a job may ask for; ask for more, or leave it out for the profile's", t, MinJobTimeout)
		}
	}
	if n := j.Network; n != nil {
		if len(n.Allow) > maxAllow {
			return bad("network.allow", "%d entries, at most %d", len(n.Allow), maxAllow)
		}
		for i, e := range n.Allow {
			if e == "" || len(e) > 260 || strings.ContainsAny(e, " \t\r\n/@") {
				return bad(fmt.Sprintf("network.allow[%d]", i), "%q is not a host, host:port or *.suffix", e)
			}
		}
	}
	for k := range j.Labels {
		if !labelPattern.MatchString(k) {
			return bad("labels", "key %q is not a label key", k)
		}
	}
	return nil
}

// validateInputs checks each input and that no two share a name.
func validateInputs(inputs []Input) error {
	seen := make(map[string]bool, len(inputs))
	for i, in := range inputs {
		field := fmt.Sprintf("inputs[%d]", i)
		switch {
		case !namePattern.MatchString(in.Name):
			return bad(field+".name", "%q must be a plain file name (letters, digits, '.', '_', '-')", in.Name)
		case seen[in.Name]:
			return bad(field+".name", "%q appears twice", in.Name)
		case !sha256Hex.MatchString(in.SHA256):
			return bad(field+".sha256", "%q is not a lowercase hex sha256", in.SHA256)
		case in.URI == "":
			return bad(field+".uri", "is empty")
		case in.Size < 0:
			return bad(field+".size", "is negative")
		}
		seen[in.Name] = true
	}
	return nil
}

// Duration is a time.Duration that reads and writes as a Go duration string ("90s").
type Duration time.Duration

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads "90s"-style strings.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"90s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Std returns the duration as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }
