// Package config owns the worker's configuration and its execution profiles: the YAML format,
// defaults and validation with messages that name the field and the fix. It reads no flags and
// no environment; cmd/worker does that and hands the result here.
package config

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/boxcar-run/boxcar/internal/job"
)

// Duration is a duration written as a Go duration string ("90s", "15m").
type Duration = job.Duration

// Config is the whole worker configuration: host settings plus the execution profiles.
// Nothing in a job can change it.
type Config struct {
	// WorkerID names this worker in job status and logs. Default: the host name.
	WorkerID string `json:"worker_id,omitempty"`
	// Concurrency is the number of jobs this worker runs at once. Default: 2.
	Concurrency int `json:"concurrency,omitempty"`
	// MetricsAddr is where /metrics, /healthz and /readyz listen. Default: 127.0.0.1:9464.
	// Empty string after defaults means "off" only when set to "off".
	MetricsAddr string `json:"metrics_addr,omitempty"`
	// DrainGrace is how long running jobs may finish after SIGTERM before they are
	// interrupted and handed back to the queue. Default: 30s.
	DrainGrace Duration `json:"drain_grace,omitempty"`
	// SigningKey is the path of an ed25519 private key (PEM) that signs manifests. Optional.
	SigningKey string `json:"signing_key,omitempty"`
	// ApproverKeyring is the path of a keyring (YAML: names, public keys, validity dates; see
	// docs/security.md) of the approvers whose signed answers let an "ask" command run.
	// Without it every answer is refused. Default with --embedded: the data dir's approver key.
	ApproverKeyring string `json:"approver_keyring,omitempty"`

	NATS    NATS    `json:"nats,omitzero"`
	Store   Store   `json:"store,omitzero"`
	Sandbox Sandbox `json:"sandbox,omitzero"`
	Model   Model   `json:"model,omitzero"`
	// Egress configures the proxy through which profiles with a network reach the outside.
	Egress Egress `json:"egress,omitzero"`

	// Profiles are the execution profiles a job may name.
	Profiles map[string]Profile `json:"profiles"`
	// Tenants are who may submit jobs and what each may run and spend (tenant.go). Default:
	// one tenant, default, granted every profile.
	Tenants map[string]Tenant `json:"tenants,omitempty"`
}

// NATS locates JetStream and names what Boxcar keeps there.
type NATS struct {
	// URL of the NATS server(s), comma separated. Default: nats://127.0.0.1:4222.
	URL string `json:"url,omitempty"`
	// Stream holding jobs. Default: BOXCAR_JOBS, subject boxcar.jobs.
	Stream  string `json:"stream,omitempty"`
	Subject string `json:"subject,omitempty"`
	// Consumer is the durable pull consumer all workers share. Default: boxcar-workers.
	Consumer string `json:"consumer,omitempty"`
	// StatusBucket is the KV bucket of job status. Default: BOXCAR_STATUS.
	StatusBucket string `json:"status_bucket,omitempty"`
	// DeadLetterStream keeps jobs that can never run. Default: BOXCAR_DLQ.
	DeadLetterStream string `json:"dead_letter_stream,omitempty"`
	// ApprovalsBucket is the KV bucket of shell commands waiting for a person (the "ask"
	// policy) and their answers, keyed <tenant>.<job id>.<call id>. Default: BOXCAR_APPROVALS.
	ApprovalsBucket string `json:"approvals_bucket,omitempty"`
	// AckWait is how long a delivery may go without an ack or heartbeat. Default: 60s; at
	// least MinAckWait.
	AckWait Duration `json:"ack_wait,omitempty"`
	// MaxDeliver bounds deliveries of one job. Default: 5.
	MaxDeliver int `json:"max_deliver,omitempty"`
	// MaxAckPending bounds jobs in flight across all workers. Default: 64.
	MaxAckPending int `json:"max_ack_pending,omitempty"`
	// DuplicateWindow drops a re-published job id inside it. Default: 1h.
	DuplicateWindow Duration `json:"duplicate_window,omitempty"`
	// RetryBackoff is the delay before the second delivery of a job that failed transiently;
	// it doubles with each attempt, up to 5m. Default: 5s.
	RetryBackoff Duration `json:"retry_backoff,omitempty"`
	// Replicas of the stream and bucket in a cluster. Default: 1.
	Replicas int `json:"replicas,omitempty"`
	// StatusTTL is how long a job's status is kept after its last change: for a job that
	// ended, after it ended. Default: 168h (7 days).
	StatusTTL Duration `json:"status_ttl,omitempty"`
	// JobMaxMsgs and JobMaxBytes bound the job stream; a submission past either is refused,
	// never a queued job dropped. Defaults: 100000 jobs, 1 GiB; JobMaxBytes is at least
	// job.MaxMessageBytes, one job's largest message.
	JobMaxMsgs  int64 `json:"job_max_msgs,omitempty"`
	JobMaxBytes int64 `json:"job_max_bytes,omitempty"`
	// DeadLetterMaxAge and DeadLetterMaxBytes bound the dead-letter stream; past them the
	// oldest dead letters go. Defaults: 720h (30 days), 1 GiB.
	DeadLetterMaxAge   Duration `json:"dead_letter_max_age,omitempty"`
	DeadLetterMaxBytes int64    `json:"dead_letter_max_bytes,omitempty"`
	// CancelMaxBytes bounds the cancel bucket, which every tenant's submitter writes: past it
	// a cancel request is refused, and the server's store (every tenant's jobs and statuses)
	// is not filled by one tenant's requests. Default: 64 MiB.
	CancelMaxBytes int64 `json:"cancel_max_bytes,omitempty"`
	// ApprovalsMaxBytes bounds the approvals bucket, where every tenant's approver writes its
	// answers and the worker its requests, for the same reason. Default: 256 MiB.
	ApprovalsMaxBytes int64 `json:"approvals_max_bytes,omitempty"`
}

// Store locates object storage.
type Store struct {
	// URL is file:///path or s3://bucket[/prefix]. Default (embedded mode): file://<data dir>/store.
	URL string `json:"url,omitempty"`
	// Endpoint of an S3-compatible service; empty means AWS.
	Endpoint string `json:"endpoint,omitempty"`
	// Region for S3 signing. Default: us-east-1.
	Region string `json:"region,omitempty"`
	// PathStyle addresses buckets as a path, as most S3-compatible servers want.
	PathStyle bool `json:"path_style,omitempty"`
	// AllowUnsafeOverwrite runs the worker on an S3-compatible server that ignores
	// If-None-Match, which it otherwise refuses: create-only puts then overwrite, and a stale
	// attempt can replace a committed run. Default: false.
	AllowUnsafeOverwrite bool `json:"allow_unsafe_overwrite,omitempty"`
	// ProbeInterval is how often an s3 store proves again, from /readyz and before a
	// create-only put, that the server still refuses a second create-only put: a server that
	// stops doing so is refused within this long. Default: 1m.
	ProbeInterval Duration `json:"probe_interval,omitempty"`
}

// Sandbox chooses where tools run. Only the host decides this.
type Sandbox struct {
	// Backend is "bubblewrap" (default) or "kubernetes".
	Backend    string     `json:"backend,omitempty"`
	Bubblewrap Bubblewrap `json:"bubblewrap,omitzero"`
	Kubernetes Kubernetes `json:"kubernetes,omitzero"`
}

// Bubblewrap settings for the single-machine backend.
type Bubblewrap struct {
	// Path of the bwrap binary. Default: bwrap from PATH.
	Path string `json:"path,omitempty"`
	// Root is where per-job workdirs are made; sandbox users must be able to traverse its
	// parents. Default: $TMPDIR/boxcar-sandboxes.
	Root string `json:"root,omitempty"`
	// DiskBestEffort accepts workdir disk bounds the kernel does not enforce, where the worker
	// cannot mount a tmpfs for each workdir (it is not root, or may not mount): the bound is then
	// measured by walking the workdir, which misses files unlinked while open. Default: false,
	// and such a worker refuses to start.
	DiskBestEffort bool `json:"disk_best_effort,omitempty"`
}

// Kubernetes settings for the pod backend.
type Kubernetes struct {
	// Namespace where sandbox pods run. Default: boxcar-sandboxes.
	Namespace string `json:"namespace,omitempty"`
	// Kubeconfig path; empty means in-cluster config.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// ImagePullPolicy of sandbox pods: Always, IfNotPresent or Never (nodes without a registry,
	// images preloaded). Default: IfNotPresent.
	ImagePullPolicy string `json:"image_pull_policy,omitempty"`
	// Instance labels sandbox pods (boxcar.run/instance) and limits the reaper to pods with the
	// same label, so that deployments sharing a namespace never reap each other's pods. Every
	// worker of one deployment sets the same value (the Helm chart: the release). A label value:
	// letters, digits, -_. and at most 63. Default: empty, no label; the reaper then takes only
	// pods without one.
	Instance string `json:"instance,omitempty"`
	// Owner names a ConfigMap in Namespace that owns every sandbox pod the worker starts (an
	// ownerReference): deleting it has Kubernetes' garbage collector delete them, warm or
	// running, which needs no worker (the Helm chart sets its own, which `helm uninstall`
	// deletes). The worker reads it (get configmaps) and is not ready while it is missing.
	// Default: empty, pods have no owner.
	Owner string `json:"owner,omitempty"`
	// BridgeImage is the worker's own image, whose static binary an init container of every
	// sandbox pod copies in, so that a profile with a network can reach the job's proxy
	// through a tunnel over pods/exec (docs/sandbox.md). The Helm chart sets the worker's
	// image. Default: empty, and a profile with a network fails on this backend.
	BridgeImage string `json:"bridge_image,omitempty"`
	// ImagePullSecrets name Secrets in Namespace (kubernetes.io/dockerconfigjson) that every
	// sandbox pod pulls its images with: the profile's image, and bridge_image for the init
	// container, which a private worker image needs. Only the names are here; each Secret must
	// exist in the sandbox namespace, as a pod's pull secrets are read from its own (the Helm
	// chart sets the release's imagePullSecrets). Default: none.
	ImagePullSecrets []string `json:"image_pull_secrets,omitempty"`
	// NetworkPolicy says what isolates the sandbox namespace's network, for the manifest's
	// sandbox.isolation: "deny-all" (the default), a NetworkPolicy denies every pod there all
	// ingress and egress (the Helm chart's, sandboxes.networkPolicy.enabled); "none", there is
	// none, and sandbox pods reach what the pod network lets them. The worker does not make the
	// policy: this states what the deployment did.
	NetworkPolicy string `json:"network_policy,omitempty"`
}

// Model is the OpenAI-compatible endpoint. The API key never appears here: it comes from
// OPENAI_API_KEY in the worker's environment.
type Model struct {
	// BaseURL of the API. Default: the worker's OPENAI_BASE_URL, else https://api.openai.com/v1.
	BaseURL string `json:"base_url,omitempty"`
	// RequestTimeout bounds one chat request. Default: 120s.
	RequestTimeout Duration `json:"request_timeout,omitempty"`
	// MaxRetries on 429 and 5xx; NoRetries (-1) for none. Default: 3.
	MaxRetries int `json:"max_retries,omitempty"`
}

// Profile is one execution profile: model, prompt, sandbox, tools and limits.
type Profile struct {
	Description  string      `json:"description,omitempty"`
	Model        ModelParams `json:"model"`
	SystemPrompt string      `json:"system_prompt,omitempty"`
	Sandbox      SandboxSpec `json:"sandbox,omitzero"`
	Tools        []Tool      `json:"tools"`
	Limits       Limits      `json:"limits,omitzero"`
	// Report is the workdir-relative file that holds the report. Default: report.md.
	Report string `json:"report,omitempty"`
	// Artifacts is the workdir-relative folder whose files are uploaded. Default: artifacts.
	Artifacts string `json:"artifacts,omitempty"`
	// Network lets the sandbox's commands reach the hosts it allows, through the worker's
	// egress proxy. Default: none, and the sandbox has no network at all.
	Network *Network `json:"network,omitempty"`
	// Secrets are credentials the proxy adds for allowed hosts; the sandbox sees placeholders.
	Secrets []Secret `json:"secrets,omitempty"`
	// Warm keeps sandboxes started ahead of the profile's jobs (warm.go). Default: none; every
	// job starts its sandbox when it begins.
	Warm *Warm `json:"warm,omitempty"`
}

// ModelParams are sent with every chat request of a profile.
type ModelParams struct {
	Name                string   `json:"name"`
	Temperature         *float64 `json:"temperature,omitempty"`
	TopP                *float64 `json:"top_p,omitempty"`
	Seed                *int64   `json:"seed,omitempty"`
	MaxCompletionTokens int64    `json:"max_completion_tokens,omitempty"`
}

// SandboxSpec bounds one job's sandbox. Quantities use Kubernetes notation ("512Mi", "500m").
type SandboxSpec struct {
	// Image is the container image (kubernetes) or a rootfs folder (bubblewrap); empty on
	// bubblewrap means the host's /usr, read-only.
	Image string `json:"image,omitempty"`
	// Workdir inside the sandbox. Default: /work.
	Workdir string `json:"workdir,omitempty"`
	// CPU limit in cores. Default: 1.
	CPU string `json:"cpu,omitempty"`
	// Memory limit. Default: 512Mi.
	Memory string `json:"memory,omitempty"`
	// Disk bounds the workdir. Default: 256Mi.
	Disk string `json:"disk,omitempty"`
	// PIDs bounds processes. Default: 128.
	PIDs int `json:"pids,omitempty"`
	// RuntimeClass for pods (gVisor, Kata). Optional.
	RuntimeClass string `json:"runtime_class,omitempty"`
	// Lifetime after which the sandbox is removed whatever happens. Default: 1h.
	Lifetime Duration `json:"lifetime,omitempty"`
}

// Tool kinds a profile can declare. The agent owns what each kind means and checks its
// declarations (internal/agent's toolKinds); a worker refuses to start with a profile it rejects.
const (
	ToolBuiltin = "builtin" // read_file, list_files, write_file
	ToolCommand = "command" // a fixed argv template with typed parameters
	ToolShell   = "shell"   // general commands under an approval policy
)

// Shell approval policies.
const (
	PolicyDeny      = "deny"
	PolicyAllowlist = "allowlist"
	PolicyAsk       = "ask"
)

// Tool is one tool a profile offers the model.
type Tool struct {
	Name        string `json:"name"`
	Kind        string `json:"kind,omitempty"` // default: command when Command is set, shell when named shell, else builtin
	Description string `json:"description,omitempty"`
	// Command is the argv template of a command tool. An element "{{param}}" is replaced whole by
	// the parameter's value; nothing goes through a shell.
	Command []string `json:"command,omitempty"`
	// Parameters is the JSON Schema of the arguments (an object schema).
	Parameters map[string]any `json:"parameters,omitempty"`
	// Timeout overrides the profile's command timeout for this tool.
	Timeout Duration `json:"timeout,omitempty"`
	// Policy and Allow govern the shell tool: deny, allowlist (glob patterns over the command
	// line), or ask (a person approves each command).
	Policy string   `json:"policy,omitempty"`
	Allow  []string `json:"allow,omitempty"`
}

// MaxCalls is the most a profile's max_turns and max_tool_calls may allow: a run's manifest
// names each model call and tool call, and its readers (provenance) take no more than this
// many of each, the worker's own read of the manifest it wrote included.
const MaxCalls = 1 << 14

// Limits are the hard caps of a profile.
type Limits struct {
	MaxTurns     int   `json:"max_turns,omitempty"`      // model round trips; default 20
	MaxToolCalls int   `json:"max_tool_calls,omitempty"` // default 30
	MaxTokens    int64 `json:"max_tokens,omitempty"`     // total tokens from usage; default 200000
	// CommandTimeout bounds one tool command. Default: 60s.
	CommandTimeout Duration `json:"command_timeout,omitempty"`
	// MaxOutputBytes is how much of a tool's output goes back to the model. Default: 16384.
	MaxOutputBytes int `json:"max_output_bytes,omitempty"`
	// JobTimeout bounds the whole job. Default: 15m.
	JobTimeout Duration `json:"job_timeout,omitempty"`
	// ApprovalTimeout is how long an `ask` command waits for a person. Default: 5m.
	ApprovalTimeout Duration `json:"approval_timeout,omitempty"`
	// MaxTranscriptBytes bounds the transcript. Default: 8MiB.
	MaxTranscriptBytes int64 `json:"max_transcript_bytes,omitempty"`
	// MaxConversationBytes bounds, per attempt, what the conversation the worker holds and
	// sends back to the model at each turn adds up to: the text of the model's answers that
	// call tools and of the tool results. The answer or result that would pass it ends the job
	// capped (max_conversation_bytes). Default: 8MiB; at least 64KiB.
	MaxConversationBytes int64 `json:"max_conversation_bytes,omitempty"`
	// MaxInputBytes bounds a job's inputs together, in bytes: a job that declares more fails
	// at its first attempt as input_too_large, before its sandbox starts. Default: the
	// workdir's size (sandbox.disk).
	MaxInputBytes int64 `json:"max_input_bytes,omitempty"`

	// jobCommandTimeout is the job's own command_timeout, when it asked for one (Tighten). It
	// is kept apart from CommandTimeout because it bounds the tools that declare their own
	// timeout too: those override the profile's command_timeout, never the job's.
	jobCommandTimeout Duration
}

// ToolTimeout is how long one command of a tool may run: the tool's own timeout when it
// declares one (own > 0), else CommandTimeout; never longer than the job's command_timeout.
func (l Limits) ToolTimeout(own Duration) Duration {
	t := l.CommandTimeout
	if own > 0 {
		t = own
	}
	if l.jobCommandTimeout > 0 && l.jobCommandTimeout < t {
		t = l.jobCommandTimeout
	}
	return t
}

// Load reads a YAML config file, fills defaults and validates it. Each problem is a FieldError
// that names the file, the line and column, and the key path (see LoadSource).
func Load(path string) (Config, error) {
	cfg, _, err := LoadSource(path)
	return cfg, err
}

// LoadSource is Load that also returns where each key of the file is, for errors that later
// checks find (Source.Place).
func LoadSource(path string) (Config, *Source, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, nil, fmt.Errorf("config: %w", err)
	}
	return ParseSource(path, data)
}

// Parse decodes YAML as YAML 1.2 reads it, strictly: an unknown key, a value of the wrong type
// or a second document is an error that names the line, the column and the key path, every one
// found reported at once. Then it fills defaults and validates.
func Parse(data []byte) (Config, error) {
	cfg, _, err := ParseSource("", data)
	return cfg, err
}

// ParseSource is Parse of the contents of file (the name its errors give), returning where each
// key is too.
func ParseSource(file string, data []byte) (Config, *Source, error) {
	var cfg Config
	src, err := decodeYAML(file, data, &cfg)
	if err != nil {
		return Config{}, src, err
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return Config{}, src, src.Place(err)
	}
	return cfg, src, nil
}

// WithDefaults returns a copy with every unset field at its documented default.
func (c Config) WithDefaults() Config {
	if c.WorkerID == "" {
		c.WorkerID, _ = os.Hostname()
	}
	def(&c.Concurrency, 2)
	def(&c.MetricsAddr, "127.0.0.1:9464")
	def(&c.DrainGrace, Duration(30*time.Second))
	n := &c.NATS
	def(&n.URL, "nats://127.0.0.1:4222")
	def(&n.Stream, "BOXCAR_JOBS")
	def(&n.Subject, "boxcar.jobs")
	def(&n.Consumer, "boxcar-workers")
	def(&n.StatusBucket, "BOXCAR_STATUS")
	def(&n.DeadLetterStream, "BOXCAR_DLQ")
	def(&n.ApprovalsBucket, "BOXCAR_APPROVALS")
	def(&n.AckWait, Duration(60*time.Second))
	def(&n.MaxDeliver, 5)
	def(&n.MaxAckPending, 64)
	def(&n.DuplicateWindow, Duration(time.Hour))
	def(&n.RetryBackoff, Duration(5*time.Second))
	def(&n.Replicas, 1)
	def(&n.StatusTTL, Duration(7*24*time.Hour))
	def(&n.JobMaxMsgs, 100_000)
	def(&n.JobMaxBytes, defaultJobMaxBytes)
	def(&n.DeadLetterMaxAge, Duration(30*24*time.Hour))
	def(&n.DeadLetterMaxBytes, 1<<30)
	def(&n.CancelMaxBytes, 64<<20)
	def(&n.ApprovalsMaxBytes, 256<<20)
	def(&c.Store.Region, "us-east-1")
	def(&c.Store.ProbeInterval, Duration(time.Minute))
	def(&c.Sandbox.Backend, "bubblewrap")
	// Sandboxes run as their own unprivileged users, which must be able to reach their
	// workdirs: the system temp folder is traversable, a home folder often is not.
	def(&c.Sandbox.Bubblewrap.Root, filepath.Join(os.TempDir(), "boxcar-sandboxes"))
	def(&c.Sandbox.Kubernetes.Namespace, "boxcar-sandboxes")
	def(&c.Sandbox.Kubernetes.NetworkPolicy, NetworkPolicyDenyAll)
	def(&c.Model.RequestTimeout, Duration(120*time.Second))
	def(&c.Model.MaxRetries, 3)
	profiles := make(map[string]Profile, len(c.Profiles))
	for name, p := range c.Profiles {
		profiles[name] = p.WithDefaults()
	}
	c.Profiles = profiles
	if c.Tenants != nil {
		tenants := make(map[string]Tenant, len(c.Tenants))
		for name, t := range c.Tenants {
			def(&t.MaxConcurrent, c.NATS.MaxAckPending)
			tenants[name] = t
		}
		c.Tenants = tenants
	}
	return c
}

// WithDefaults returns a copy of the profile with every unset field at its default.
func (p Profile) WithDefaults() Profile {
	s := &p.Sandbox
	def(&s.Workdir, "/work")
	def(&s.CPU, "1")
	def(&s.Memory, "512Mi")
	def(&s.Disk, "256Mi")
	def(&s.PIDs, 128)
	def(&s.Lifetime, Duration(time.Hour))
	l := &p.Limits
	def(&l.MaxTurns, 20)
	def(&l.MaxToolCalls, 30)
	def(&l.MaxTokens, 200000)
	def(&l.CommandTimeout, Duration(60*time.Second))
	def(&l.MaxOutputBytes, 16384)
	def(&l.JobTimeout, Duration(15*time.Minute))
	def(&l.ApprovalTimeout, Duration(5*time.Minute))
	def(&l.MaxTranscriptBytes, 8<<20)
	def(&l.MaxConversationBytes, DefaultMaxConversationBytes)
	if q, err := resource.ParseQuantity(s.Disk); err == nil {
		def(&l.MaxInputBytes, q.Value())
	}
	def(&p.Report, "report.md")
	if p.Warm != nil {
		w := p.Warm.withDefaults()
		p.Warm = &w
	}
	def(&p.Artifacts, "artifacts")
	tools := make([]Tool, len(p.Tools))
	for i, t := range p.Tools {
		if t.Kind == "" {
			switch {
			case len(t.Command) > 0:
				t.Kind = ToolCommand
			case t.Name == "shell":
				t.Kind = ToolShell
			default:
				t.Kind = ToolBuiltin
			}
		}
		if t.Kind == ToolShell {
			def(&t.Policy, PolicyDeny)
		}
		tools[i] = t
	}
	p.Tools = tools
	return p
}

var toolName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// labelValue is a Kubernetes label value, empty or at most 63 characters.
var labelValue = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$`)

// namespaceName is a Kubernetes namespace's name, a DNS label.
var namespaceName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// objectName is a Kubernetes object's name, a DNS subdomain: what a Secret may be called.
var objectName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`)

// The values of sandbox.kubernetes.network_policy.
const (
	NetworkPolicyDenyAll = "deny-all"
	NetworkPolicyNone    = "none"
)

// Validate reports every problem it finds, each a FieldError naming the field.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Path: field, Msg: fmt.Sprintf(format, args...)})
	}
	if c.Concurrency < 1 {
		bad("concurrency", "must be at least 1")
	}
	switch c.Sandbox.Backend {
	case "bubblewrap", "kubernetes":
	default:
		bad("sandbox.backend", "%q is not a backend; use bubblewrap or kubernetes", c.Sandbox.Backend)
	}
	errs = append(errs, c.Sandbox.Kubernetes.validate()...)
	if c.NATS.MaxDeliver < 1 || c.NATS.MaxAckPending < 1 || c.NATS.AckWait <= 0 {
		bad("nats", "max_deliver, max_ack_pending and ack_wait must be positive")
	} else if c.NATS.AckWait.Std() < MinAckWait {
		bad("nats.ack_wait", "%s is shorter than %s: running jobs send their heartbeats a second apart, and `worker setup` may set this while they run", c.NATS.AckWait.Std(), MinAckWait)
	}
	if n := c.NATS; n.StatusTTL <= 0 || n.JobMaxMsgs < 1 || n.JobMaxBytes < 1 || n.DeadLetterMaxAge <= 0 || n.DeadLetterMaxBytes < 1 || n.CancelMaxBytes < 1 || n.ApprovalsMaxBytes < 1 {
		bad("nats", "status_ttl, job_max_msgs, job_max_bytes, dead_letter_max_age, dead_letter_max_bytes, cancel_max_bytes and approvals_max_bytes must be positive")
	} else if n.JobMaxBytes < job.MaxMessageBytes {
		// A tenant's job stream this small refuses every job, as a tenant's max_queued_bytes
		// would (queueBounds).
		bad("nats.job_max_bytes", "%d is below %d, one job's largest message; give at least that, or leave it unset for the default (%d)", n.JobMaxBytes, job.MaxMessageBytes, defaultJobMaxBytes)
	}
	errs = append(errs, c.validateEndpoints()...)
	errs = append(errs, c.validateWorker()...)
	errs = append(errs, c.Egress.validate()...)
	if c.Store.ProbeInterval < 0 {
		bad("store.probe_interval", "must be positive")
	}
	if len(c.Profiles) == 0 {
		bad("profiles", "none defined; a worker needs at least one profile (see examples/boxcar.yaml)")
	}
	names := make([]string, 0, len(c.Profiles))
	for name := range c.Profiles {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !job.ValidProfileName(name) {
			// No job could name it (job.Validate refuses the name), yet tenants could be granted it.
			bad("profiles."+name, "%q is not a profile name a job can give: a letter or digit, then letters, digits, '.', '_' or '-', at most 128", name)
		}
		errs = append(errs, c.Profiles[name].validate("profiles."+name)...)
	}
	errs = append(errs, c.validateTenants()...)
	errs = append(errs, c.NATS.validateNames()...)
	// Last, so that a key a check above names is not named twice.
	errs = append(errs, checkValues(reflect.ValueOf(c), "", namedIn(errs))...)
	return errors.Join(errs...)
}

func (k Kubernetes) validate() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Path: "sandbox.kubernetes." + field, Msg: fmt.Sprintf(format, args...)})
	}
	switch k.ImagePullPolicy {
	case "", "Always", "IfNotPresent", "Never":
	default:
		bad("image_pull_policy", "%q is not a pull policy; use Always, IfNotPresent or Never", k.ImagePullPolicy)
	}
	if !namespaceName.MatchString(k.Namespace) {
		bad("namespace", "%q is not a namespace's name: lower-case letters, digits and '-', at most 63", k.Namespace)
	}
	if k.Owner != "" && !objectName.MatchString(k.Owner) {
		bad("owner", "%q is not a ConfigMap's name: lower-case letters, digits, '-' and '.', at most 253", k.Owner)
	}
	if !labelValue.MatchString(k.Instance) {
		bad("instance", "%q is not a label value: letters, digits, -_. between two letters or digits, at most 63", k.Instance)
	}
	for i, name := range k.ImagePullSecrets {
		if !objectName.MatchString(name) {
			bad(fmt.Sprintf("image_pull_secrets[%d]", i), "%q is not a Secret's name: lower-case letters, digits, '-' and '.', at most 253", name)
		}
	}
	switch k.NetworkPolicy {
	case "", NetworkPolicyDenyAll, NetworkPolicyNone:
	default:
		bad("network_policy", "%q is not a network policy; use %s (a NetworkPolicy denies the sandbox namespace all traffic) or %s", k.NetworkPolicy, NetworkPolicyDenyAll, NetworkPolicyNone)
	}
	return errs
}

func (p Profile) validate(prefix string) []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Path: prefix + "." + field, Msg: fmt.Sprintf(format, args...)})
	}
	if p.Model.Name == "" {
		bad("model.name", "is required (the model the endpoint serves, e.g. gpt-4.1-mini)")
	}
	for field, q := range map[string]string{"sandbox.cpu": p.Sandbox.CPU, "sandbox.memory": p.Sandbox.Memory, "sandbox.disk": p.Sandbox.Disk} {
		if v, err := resource.ParseQuantity(q); err != nil || v.Sign() <= 0 {
			bad(field, "%q is not a positive quantity such as 500m, 1, 512Mi or 1Gi", q)
		}
	}
	if p.Sandbox.PIDs < 1 {
		bad("sandbox.pids", "must be at least 1")
	}
	if len(p.Sandbox.Workdir) < 2 || p.Sandbox.Workdir[0] != '/' {
		bad("sandbox.workdir", "%q must be an absolute path other than /", p.Sandbox.Workdir)
	}
	p.validateOutputs(bad)
	if len(p.Tools) == 0 {
		bad("tools", "none defined; the model needs at least one tool")
	}
	seen := map[string]bool{}
	for i, t := range p.Tools {
		field := fmt.Sprintf("tools[%d]", i)
		if !toolName.MatchString(t.Name) {
			bad(field+".name", "%q must be 1-64 letters, digits, '_' or '-'", t.Name)
		}
		if seen[t.Name] {
			bad(field+".name", "%q is declared twice", t.Name)
		}
		seen[t.Name] = true
		if t.Kind == "" {
			bad(field+".kind", "is empty")
		}
		// Each kind checks the rest of its declaration: see internal/agent's toolKinds.
	}
	p.validateSize(bad)
	field := func(f string) string { return prefix + "." + f }
	if p.Network != nil {
		errs = append(errs, p.Network.validate(field)...)
	}
	errs = append(errs, validateSecrets(p.Network, p.Secrets, field)...)
	if p.Warm != nil {
		errs = append(errs, p.Warm.validate(field)...)
	}
	p.Limits.validate(bad)
	return errs
}

// validate reports each limit out of its range through bad.
func (l Limits) validate(bad func(field, format string, args ...any)) {
	if l.MaxTurns < 1 || l.MaxToolCalls < 1 || l.MaxTokens < 1 || l.MaxOutputBytes < 256 || l.CommandTimeout <= 0 || l.JobTimeout <= 0 {
		bad("limits", "max_turns, max_tool_calls, max_tokens, command_timeout and job_timeout must be positive, max_output_bytes at least 256")
	}
	if l.MaxTurns > MaxCalls || l.MaxToolCalls > MaxCalls {
		bad("limits", "max_turns and max_tool_calls may be at most %d: a run's manifest names each call, and no reader takes more", MaxCalls)
	}
	if l.MaxConversationBytes < MinConversationBytes {
		bad("limits.max_conversation_bytes", "%d is below %d (64KiB); leave it unset for the default (%d)",
			l.MaxConversationBytes, MinConversationBytes, DefaultMaxConversationBytes)
	}
	if l.MaxInputBytes < 0 {
		bad("limits.max_input_bytes", "must not be negative; leave it unset for the workdir's size (sandbox.disk)")
	}
}

// Tighten returns the profile's limits narrowed by a job's requested limits; a job can never
// loosen a limit.
func (l Limits) Tighten(j *job.Limits) Limits {
	if j == nil {
		return l
	}
	tighter := func(cur *int, req int) {
		if req > 0 && req < *cur {
			*cur = req
		}
	}
	tighter(&l.MaxTurns, j.MaxTurns)
	tighter(&l.MaxToolCalls, j.MaxToolCalls)
	if j.MaxTokens > 0 && j.MaxTokens < l.MaxTokens {
		l.MaxTokens = j.MaxTokens
	}
	if j.JobTimeout > 0 && j.JobTimeout < l.JobTimeout {
		l.JobTimeout = j.JobTimeout
	}
	if j.CommandTimeout > 0 && j.CommandTimeout < l.CommandTimeout {
		l.CommandTimeout = j.CommandTimeout
	}
	if c := j.CommandTimeout; c > 0 && (l.jobCommandTimeout == 0 || c < l.jobCommandTimeout) {
		l.jobCommandTimeout = c
	}
	return l
}

// validateOutputs reports, through bad, a report or artifacts path the sandbox would refuse.
func (p Profile) validateOutputs(bad func(field, format string, args ...any)) {
	if msg := workdirRelative(p.Report); msg != "" || path.Clean("/"+p.Report) == "/" {
		bad("report", "%q %s; give a file inside the workdir, such as report.md", p.Report, cmp.Or(msg, "is the workdir itself"))
	}
	if msg := workdirRelative(p.Artifacts); msg != "" {
		bad("artifacts", "%q %s; give a folder inside the workdir, such as artifacts", p.Artifacts, msg)
	}
}

// workdirRelative says why name is not a path inside the workdir, as the sandbox reads the
// report and the artifacts (sandbox.CleanPath), or "" when it is one: a path the sandbox
// refuses would fail every job of the profile at its end, after its whole run.
func workdirRelative(name string) string {
	switch {
	case strings.ContainsRune(name, 0):
		return "contains a NUL byte"
	case strings.HasPrefix(name, "/") || strings.HasPrefix(name, `\`):
		return "is absolute"
	case slices.Contains(strings.Split(name, "/"), ".."):
		return `climbs out of the workdir with ".."`
	}
	return ""
}

// DefaultMaxConversationBytes is limits.max_conversation_bytes when a profile sets none: twice
// what a million-token context window holds as text, so no conversation a model can read is
// cut, and a small share of a worker's memory per job however large the endpoint's answers
// (each may be agent.DefaultMaxResponseBytes).
const DefaultMaxConversationBytes = 8 << 20

// defaultJobMaxBytes is nats.job_max_bytes when the config gives none.
const defaultJobMaxBytes = 1 << 30

// MinConversationBytes is the smallest limits.max_conversation_bytes: a few tool results of
// max_output_bytes' default.
const MinConversationBytes = 64 << 10

// MinAckWait is the shortest nats.ack_wait a config may set. A running job's heartbeats go at
// most a third of it apart whatever its consumer's ack wait (queue.Delivery.KeepAlive), so that
// `worker setup` may lower the ack wait to it while jobs run without one being delivered again.
const MinAckWait = 3 * time.Second

func def[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// Profile returns the named profile or an error wrapping ErrUnknownProfile that lists the
// profiles this worker defines.
func (c Config) Profile(name string) (Profile, error) {
	if p, ok := c.Profiles[name]; ok {
		return p, nil
	}
	names := make([]string, 0, len(c.Profiles))
	for n := range c.Profiles {
		names = append(names, n)
	}
	sort.Strings(names)
	return Profile{}, fmt.Errorf("%w %q: this worker defines %v", ErrUnknownProfile, name, names)
}
