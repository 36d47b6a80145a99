package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
)

// TestBadConfigsAreRefusedAtLoad: every mistake an operator can write in a worker config
// (testdata/bad) stops Load with an error that names the file, the line and the key and says
// what to write instead; none is taken as a default, none panics or hangs, none waits for the
// first job or `worker setup` to fail.
func TestBadConfigsAreRefusedAtLoad(t *testing.T) {
	t.Parallel()
	tests := []struct{ file, want string }{
		{"unknown-key", `:1:1 concurency: unknown key (did you mean "concurrency"?)`},
		{"wrong-type", `:1:14 concurrency: expected an integer, got a string "two"`},
		{"negative-duration", `:1:14 drain_grace: -5s is negative; give a positive duration such as 90s, or leave it unset for the default`},
		{"negative-retry-backoff", `:1:23 nats.retry_backoff: -1s is negative`},
		{"overflowing-job-timeout", `:5:27 profiles.p.limits.job_timeout: 2000000h0m0s is longer than 87600h0m0s (10 years), the longest duration the worker takes; give a shorter one`},
		{"huge-ack-wait", `:1:18 nats.ack_wait: 2562047h0m0s is longer than 87600h0m0s (10 years)`},
		{"not-a-duration", `:1:20 nats.status_ttl: "7d" is not a duration such as 90s, 15m or 1h30m`},
		{"size-past-int64", `:1:23 nats.job_max_bytes: 99999999999999999999 is out of range; at most 9223372036854775807`},
		{"negative-size", `:5:36 profiles.p.limits.max_transcript_bytes: -1 is negative; give a positive number, or leave it unset for the default`},
		{"negative-retries", `:1:22 model.max_retries: -2 is below -1; give the number of retries, -1 for none, or leave it unset for the default`},
		{"replicas-too-many", `:1:18 nats.replicas: 7 is not between 1 and 5, the replicas JetStream keeps of a stream`},
		{"warm-min-above-max", `:5:17 profiles.p.warm.min: 3 is above max 2; lower min or raise max`},
		{"empty-model-name", `:3:19 profiles.p.model.name: is required`},
		{"profile-name-not-a-token", `:3:5 profiles.a b: "a b" is not a profile name a job can give`},
		{"tenant-name-uppercase", `:6:11 tenants.Team-A: "Team-A" is not a tenant name`},
		{"tenant-profile-unknown", `:6:23 tenants.team-a.profiles[0]: "q" is not a profile of this config`},
		{"tenant-negative-max-queued", `:6:39 tenants.team-a.max_queued: -1 is negative; give a positive number, or leave it unset for nats.job_max_msgs`},
		{"tenant-max-queued-bytes-below-a-job", `:6:45 tenants.team-a.max_queued_bytes: 1000 is below 65536, one job's largest message; give at least that, or leave it unset for nats.job_max_bytes`},
		{"nats-job-max-bytes-below-a-job", `:1:23 nats.job_max_bytes: 1 is below 65536, one job's largest message; give at least that, or leave it unset for the default (1073741824)`},
		{"shared-tenant-bucket", `tenants.team-b.bucket: "shared-bucket" is tenant team-a's bucket too; each tenant needs its own`},
		{"profile-twice", `:5:3 profiles.p: given twice (first on line 2)`},
		{"stream-not-a-name", `:1:16 nats.stream: "boxcar.jobs" is not a JetStream name: no spaces, '.', '*', '>', '/' or '\', at most 255`},
		{"subject-wildcard", `:1:17 nats.subject: "boxcar.*" is not a subject without wildcards`},
		{"subject-empty-token", `:1:17 nats.subject: "boxcar..jobs" is not a subject without wildcards`},
		{"bucket-not-a-name", `:1:23 nats.status_bucket: "status bucket" is not a bucket name: letters, digits, '_' and '-'`},
		{"streams-share-a-name", `:1:42 nats.dead_letter_stream: is stored in the stream JOBS, as nats.stream is; give each its own name`},
		{"stream-names-a-tenants-stream", `nats.stream: "JOBS" makes tenant dlq's job stream JOBS_dlq, the stream of nats.dead_letter_stream; give them names apart`},
		{"status-bucket-names-a-tenants-bucket", `nats.status_bucket: "ST" makes tenant ops's status bucket's stream KV_ST_ops, the stream of nats.approvals_bucket; give them names apart`},
		{"approvals-bucket-names-a-tenants-bucket", `nats.approvals_bucket: "AP" makes tenant ops's approvals bucket's stream KV_AP_ops, the stream of nats.status_bucket; give them names apart`},
		{"stream-names-a-tenants-cancel-bucket", `nats.stream: is stored in the stream KV_BOXCAR_CANCEL_ops, tenant ops's cancel bucket's (BOXCAR_CANCEL_ops); give it another name`},
		{"bucket-is-a-stream", `nats.status_bucket: is stored in the stream KV_BOXCAR_STATUS, as nats.stream is; give each its own name`},
		{"subject-under-dead-letters", `:1:17 nats.subject: "BOXCAR_DLQ.jobs" begins with BOXCAR_DLQ, the name of a dead-letter stream`},
		{"subject-under-a-tenants-dead-letters", `:1:17 nats.subject: "BOXCAR_DLQ_ops.jobs" begins with BOXCAR_DLQ_ops, the name of a dead-letter stream`},
		{"dead-letters-name-a-tenants-stream", `nats.dead_letter_stream: "DL" makes tenant ops's dead-letter stream DL_ops, the stream of nats.stream; give them names apart`},
		{"report-outside-workdir", `:5:13 profiles.p.report: "../report.md" climbs out of the workdir with ".."; give a file inside the workdir, such as report.md`},
		{"artifacts-absolute", `:5:16 profiles.p.artifacts: "/etc" is absolute; give a folder inside the workdir, such as artifacts`},
		{"merge-key", `:6:13 profiles.q.model: merge keys (<<) are not supported; write the keys out`},
		{"egress-cidr", `:5:25 egress.denied_cidrs[0]: "10.0.0.0" is not a CIDR prefix such as 10.20.0.0/16 or fd00::/8`},
		{"namespace-not-a-name", `:1:56 sandbox.kubernetes.namespace: "Boxcar_Sandboxes" is not a namespace's name: lower-case letters, digits and '-', at most 63`},
		{"owner-not-a-name", `sandbox.kubernetes.owner: "Boxcar-Owner" is not a ConfigMap's name`},
		{"metrics-addr-no-port", `:1:15 metrics_addr: "9464" is not host:port; give 127.0.0.1:9464 (this machine only), :9464 (every address) or off`},
		{"metrics-addr-port-not-a-number", `:1:15 metrics_addr: "127.0.0.1:http-alt" has no port number from 0 to 65535`},
		{"worker-id-not-a-label", `:1:12 worker_id: "worker 1/a" is not a label value, which the kubernetes backend labels each sandbox pod with: letters, digits, -_. between two letters or digits, at most 63`},
		{"model-url-password", `:1:19 model.base_url: holds credentials (a user:password@ or a token@); put the API key in OPENAI_API_KEY`},
		{"model-url-key-in-query", `:1:19 model.base_url: holds a query (such as ?api_key=), which may be a secret; put the API key in OPENAI_API_KEY`},
		{"model-url-not-http-key-in-query", `:1:19 model.base_url: holds a query`},
		{"store-endpoint-password", `:1:42 store.endpoint: holds credentials (a user:password@ or a token@); put the S3 keys in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY`},
		{"store-endpoint-query", `:1:42 store.endpoint: holds a query`},
		{"nats-url-query", `:1:13 nats.url: holds a query (such as ?api_key=), which may be a secret; the NATS client reads none: give the servers as nats://host:port`},
		{"store-url-query", `:1:14 store.url: holds a query (such as ?api_key=), which may be a secret; the store reads none: give s3://bucket[/prefix] or file:///path, the region in store.region and path-style addressing in store.path_style`},
		{"store-url-fragment", `:1:14 store.url: holds a fragment (#…), which may be a secret; the store reads none`},
		{"nats-url-password", `:1:13 nats.url: holds credentials (a user:password@ or a token@); give them with --nats-creds (NATS_CREDS)`},
		{"alias-bomb", `profiles.p.tools[0].parameters.l8: yaml: document contains excessive aliasing`},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join("testdata", "bad", tt.file+".yaml")
			_, err := config.Load(path)
			if !errors.Is(err, config.ErrInvalid) {
				t.Fatalf("Load(%s) = %v, want ErrInvalid", path, err)
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Load(%s):\n%v\nwant it to name the file and say\n%s", path, err, tt.want)
			}
			if strings.Contains(err.Error(), "s3cr") { // each secret of testdata/bad holds it
				t.Errorf("Load(%s) quotes the secret:\n%v", path, err)
			}
		})
	}
}

// TestConfigFileThatCannotBeRead: a path that is a folder or a file that is not there is
// refused naming the path, not read as an empty config of defaults.
func TestConfigFileThatCannotBeRead(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tt := range []struct{ path, want string }{
		{dir, dir + ": is a directory"},
		{filepath.Join(dir, "missing.yaml"), filepath.Join(dir, "missing.yaml") + ": no such file or directory"},
	} {
		if _, err := config.Load(tt.path); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Load(%s) = %v, want %q", tt.path, err, tt.want)
		}
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
}

// TestNoRetriesIsAccepted: max_retries -1 turns the model client's retries off (agent.Config),
// the one negative count the config takes; 0 takes the default.
func TestNoRetriesIsAccepted(t *testing.T) {
	cfg, err := config.Parse([]byte("model: {max_retries: -1}\nprofiles:\n  p:\n    model: {name: m}\n    tools: [{name: read_file}]\n"))
	if err != nil {
		t.Fatalf("Parse with max_retries -1: %v", err)
	}
	if cfg.Model.MaxRetries != config.NoRetries {
		t.Fatalf("max_retries = %d, want %d", cfg.Model.MaxRetries, config.NoRetries)
	}
}
