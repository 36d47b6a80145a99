package config_test

import (
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/schemagen"
	"github.com/boxcar-run/boxcar/internal/schemagen/schematest"
)

// profile is a valid config whose one profile "p" has extra YAML (indented 4) added, or its
// tools replaced when extra starts with "tools:".
func profile(extra string) string {
	tools := "    tools: [{name: read_file}]\n"
	if strings.HasPrefix(extra, "tools:") {
		tools = ""
	}
	if extra != "" {
		extra = "    " + strings.ReplaceAll(strings.TrimRight(extra, "\n"), "\n", "\n    ") + "\n"
	}
	return "profiles:\n  p:\n    model: {name: m}\n" + tools + extra
}

// toolSchema is a profile's tools: one command tool whose parameter v has schema.
func toolSchema(schema string) string {
	return "tools:\n  - name: stats\n    command: [awk, '{{v}}']\n    parameters: {type: object, properties: {v: " + schema + "}}"
}

// TestSchemaAgreesWithValidate: the generated schema and the worker's own Parse accept and
// refuse the same configs, so a tool that checks the schema (helm install) refuses what the
// worker would refuse at start. The two checks JSON Schema cannot say are listed as such, and
// the chart's templates repeat them (deploy/helm).
func TestSchemaAgreesWithValidate(t *testing.T) {
	s, err := schemagen.Generate(config.Config{}, config.SchemaOptions())
	if err != nil {
		t.Fatal(err)
	}
	v := schematest.Compile(t, s)
	tests := []struct {
		name string
		yaml string
		// schemaCannot marks a mistake Parse refuses that has no JSON Schema form.
		schemaCannot bool
	}{
		// Accepted by both.
		{name: "example config", yaml: string(examples.Config)},
		{name: "minimal", yaml: profile("")},
		{name: "zero values take defaults", yaml: "concurrency: 0\nnats: {max_deliver: 0, ack_wait: 0s}\n" + profile("sandbox: {pids: 0, cpu: '', workdir: ''}\nlimits: {max_output_bytes: 0, job_timeout: '0'}")},
		{name: "quantities", yaml: profile("sandbox: {cpu: 500m, memory: 1.5Gi, disk: '1e9'}")},
		{name: "fractional cpu", yaml: profile("sandbox: {cpu: '0.25'}")},
		{name: "quantities as numbers", yaml: profile("sandbox: {cpu: 2, memory: 1e9}")},
		{name: "a number where a string goes", yaml: "store: {region: 1}\n" + profile("system_prompt: true")},
		{name: "retention", yaml: "nats: {status_ttl: 24h, job_max_msgs: 5000, job_max_bytes: 1e8, dead_letter_max_age: 72h, dead_letter_max_bytes: 1000000}\n" + profile("")},
		{name: "durations", yaml: "nats: {ack_wait: 1m30s, retry_backoff: 250ms}\n" + profile("limits: {job_timeout: 1h, command_timeout: 1.5s}")},
		{name: "a tool schema of many values", yaml: profile(toolSchema("{enum: [" + strings.Repeat("1, ", config.MaxProfileValues/2) + "1]}"))},
		{name: "a tool schema nested deep", yaml: profile(toolSchema(strings.Repeat("{a: ", config.MaxProfileDepth-8) + "1" + strings.Repeat("}", config.MaxProfileDepth-8)))},
		{name: "command tool", yaml: profile("tools:\n  - name: stats\n    command: [awk, -f, x.awk, '{{path}}']\n    parameters: {type: object, properties: {path: {type: string}}}")},
		{name: "shell allowlist", yaml: profile("tools:\n  - {name: shell, policy: allowlist, allow: ['ls *']}")},
		{name: "shell by name", yaml: profile("tools:\n  - {name: shell}")},
		{name: "shell ask", yaml: profile("tools:\n  - {name: sh, kind: shell, policy: ask}")},
		{name: "kubernetes backend", yaml: "sandbox: {backend: kubernetes, kubernetes: {image_pull_policy: Never, instance: boxcar.prod}}\n" + profile("")},
		{name: "kubernetes as deployed", yaml: "sandbox: {backend: kubernetes, kubernetes: {image_pull_secrets: [regcred, mirror.example], network_policy: none}}\n" + profile("")},
		{name: "max_output_bytes 256", yaml: profile("limits: {max_output_bytes: 256}")},
		{name: "kubernetes names", yaml: "sandbox: {kubernetes: {namespace: sandboxes-1, owner: boxcar.owner}}\n" + profile("")},
		{name: "nats names", yaml: "nats: {stream: JOBS-1, dead_letter_stream: DLQ_1, consumer: w, status_bucket: S, approvals_bucket: A, subject: acme.jobs, replicas: 5}\n" + profile("")},
		{name: "a negative seed", yaml: "profiles:\n  p:\n    model: {name: m, seed: -7}\n    tools: [{name: read_file}]\n"},
		{name: "tenants", yaml: profile("") + "tenants:\n  team-a: {profiles: [p], max_concurrent: 4, daily_tokens: 2000000}\n  b: {profiles: [p], max_concurrent: 0, bucket: ''}\n"},
		{name: "tenant queue bounds", yaml: profile("") + "tenants:\n  a: {profiles: [p], max_queued: 1, max_queued_bytes: 65536}\n  b: {profiles: [p], max_queued: 0, max_queued_bytes: 0}\n"},
		{name: "tenant with a bucket", yaml: "store: {url: s3://x}\n" + profile("") + "tenants:\n  a: {profiles: [p], bucket: boxcar-a}\n"},
		{name: "nullable model params", yaml: "profiles:\n  p:\n    model: {name: m, temperature: null, seed: 7}\n    tools: [{name: read_file}]\n"},

		// Refused by both.
		{name: "misspelt key", yaml: "nats: {strem: X}\n" + profile("")},
		{name: "unknown top-level key", yaml: "concurency: 2\n" + profile("")},
		{name: "unknown profile field", yaml: profile("timeout: 5m")},
		{name: "path_style not a boolean", yaml: "store: {path_style: 'yes'}\n" + profile("")},
		{name: "ack_wait not a duration", yaml: "nats: {ack_wait: banana}\n" + profile("")},
		{name: "ack_wait a number", yaml: "nats: {ack_wait: 60}\n" + profile("")},
		{name: "ack_wait negative", yaml: "nats: {ack_wait: -5s}\n" + profile("")},
		{name: "status_ttl negative", yaml: "nats: {status_ttl: -1h}\n" + profile("")},
		{name: "job_max_msgs negative", yaml: "nats: {job_max_msgs: -1}\n" + profile("")},
		{name: "dead_letter_max_bytes negative", yaml: "nats: {dead_letter_max_bytes: -5}\n" + profile("")},
		{name: "max_deliver negative", yaml: "nats: {max_deliver: -1}\n" + profile("")},
		{name: "max_ack_pending negative", yaml: "nats: {max_ack_pending: -3}\n" + profile("")},
		{name: "concurrency negative", yaml: "concurrency: -1\n" + profile("")},
		{name: "concurrency fractional", yaml: "concurrency: 1.5\n" + profile("")},
		{name: "unknown backend", yaml: "sandbox: {backend: docker}\n" + profile("")},
		{name: "unknown pull policy", yaml: "sandbox: {kubernetes: {image_pull_policy: sometimes}}\n" + profile("")},
		{name: "instance not a label value", yaml: "sandbox: {kubernetes: {instance: -prod}}\n" + profile("")},
		{name: "pull secret not a name", yaml: "sandbox: {kubernetes: {image_pull_secrets: [Regcred]}}\n" + profile("")},
		{name: "network policy unknown", yaml: "sandbox: {kubernetes: {network_policy: allow-all}}\n" + profile("")},
		{name: "no profiles", yaml: "concurrency: 1\n"},
		{name: "empty profiles", yaml: "profiles: {}\n"},
		{name: "no model", yaml: "profiles:\n  p:\n    tools: [{name: read_file}]\n"},
		{name: "empty model name", yaml: "profiles:\n  p:\n    model: {name: ''}\n    tools: [{name: read_file}]\n"},
		{name: "no tools", yaml: "profiles:\n  p:\n    model: {name: m}\n"},
		{name: "empty tools", yaml: profile("tools: []")},
		{name: "memory not a quantity", yaml: profile("sandbox: {memory: lots}")},
		{name: "cpu zero", yaml: profile("sandbox: {cpu: '0'}")},
		{name: "cpu negative", yaml: profile("sandbox: {cpu: '-1'}")},
		{name: "cpu zero as a number", yaml: profile("sandbox: {cpu: 0}")},
		{name: "disk zero with suffix", yaml: profile("sandbox: {disk: 0Mi}")},
		{name: "pids negative", yaml: profile("sandbox: {pids: -1}")},
		{name: "relative workdir", yaml: profile("sandbox: {workdir: work}")},
		{name: "root workdir", yaml: profile("sandbox: {workdir: /}")},
		{name: "lifetime not a duration", yaml: profile("sandbox: {lifetime: forever}")},
		{name: "tool name with a space", yaml: profile("tools: [{name: 'read file'}]")},
		{name: "max_turns negative", yaml: profile("limits: {max_turns: -1}")},
		{name: "max_turns past what a manifest names", yaml: profile("limits: {max_turns: 16385}")},
		{name: "max_tool_calls past what a manifest names", yaml: profile("limits: {max_tool_calls: 16385}")},
		{name: "max_output_bytes too small", yaml: profile("limits: {max_output_bytes: 100}")},
		{name: "job_timeout negative", yaml: profile("limits: {job_timeout: -1m}")},
		{name: "temperature a string", yaml: "profiles:\n  p:\n    model: {name: m, temperature: warm}\n    tools: [{name: read_file}]\n"},

		{name: "profile name with a space", yaml: "profiles:\n  'web research':\n    model: {name: m}\n    tools: [{name: read_file}]\n"},
		{name: "profile name with a slash", yaml: "profiles:\n  analyse/csv:\n    model: {name: m}\n    tools: [{name: read_file}]\n"},
		{name: "tenant name uppercase", yaml: profile("") + "tenants:\n  A: {profiles: [p]}\n"},
		{name: "tenant grants nothing", yaml: profile("") + "tenants:\n  a: {profiles: []}\n"},
		{name: "tenant without profiles", yaml: profile("") + "tenants:\n  a: {daily_tokens: 5}\n"},
		{name: "tenant daily_tokens negative", yaml: profile("") + "tenants:\n  a: {profiles: [p], daily_tokens: -5}\n"},
		{name: "tenant max_concurrent negative", yaml: profile("") + "tenants:\n  a: {profiles: [p], max_concurrent: -1}\n"},
		{name: "tenant max_queued negative", yaml: profile("") + "tenants:\n  a: {profiles: [p], max_queued: -1}\n"},
		{name: "tenant max_queued_bytes below a job", yaml: profile("") + "tenants:\n  a: {profiles: [p], max_queued_bytes: 65535}\n"},
		{name: "tenant bucket not a name", yaml: profile("") + "tenants:\n  a: {profiles: [p], bucket: A_B}\n"},
		{name: "tenant unknown key", yaml: profile("") + "tenants:\n  a: {profiles: [p], quota: 5}\n"},
		{name: "namespace with a capital", yaml: "sandbox: {kubernetes: {namespace: Sandboxes}}\n" + profile("")},
		{name: "owner with an underscore", yaml: "sandbox: {kubernetes: {owner: boxcar_owner}}\n" + profile("")},
		{name: "drain_grace negative", yaml: "drain_grace: -1s\n" + profile("")},
		{name: "warm idle negative", yaml: profile("warm: {idle: -1m}")},
		{name: "max_retries below -1", yaml: "model: {max_retries: -2}\n" + profile("")},
		{name: "max_transcript_bytes negative", yaml: profile("limits: {max_transcript_bytes: -1}")},
		{name: "egress max_bytes negative", yaml: "egress: {limits: {max_bytes: -1}}\n" + profile("")},
		{name: "replicas past 5", yaml: "nats: {replicas: 6}\n" + profile("")},
		{name: "stream with a dot", yaml: "nats: {stream: boxcar.jobs}\n" + profile("")},
		{name: "consumer with a space", yaml: "nats: {consumer: 'my workers'}\n" + profile("")},
		{name: "bucket with a dot", yaml: "nats: {approvals_bucket: a.b}\n" + profile("")},
		{name: "subject with a wildcard", yaml: "nats: {subject: 'boxcar.>'}\n" + profile("")},
		{name: "subject with an empty token", yaml: "nats: {subject: 'boxcar.'}\n" + profile("")},

		// Refused by Parse only: no JSON Schema form.
		{name: "tenant granted an undefined profile", yaml: profile("") + "tenants:\n  a: {profiles: [nope]}\n", schemaCannot: true},
		{name: "two tenants, one bucket", yaml: "store: {url: s3://x}\n" + profile("") + "tenants:\n  a: {profiles: [p], bucket: bb-1}\n  b: {profiles: [p], bucket: bb-1}\n", schemaCannot: true},
		{name: "nats.url that does not parse", yaml: "nats: {url: 'nats://u:p%zz@h:4222'}\n" + profile(""), schemaCannot: true},
		{name: "ack_wait under the shortest allowed", yaml: "nats: {ack_wait: 2s}\n" + profile(""), schemaCannot: true},
		{name: "model.base_url not http", yaml: "model: {base_url: 'ftp://h/v1'}\n" + profile(""), schemaCannot: true},
		{name: "tool declared twice", yaml: profile("tools: [{name: read_file}, {name: read_file}]"), schemaCannot: true},
		{name: "job_timeout past 10 years", yaml: profile("limits: {job_timeout: 100000h}"), schemaCannot: true},
		{name: "two keys, one stream", yaml: "nats: {dead_letter_stream: BOXCAR_JOBS}\n" + profile(""), schemaCannot: true},
		{name: "subject under the dead letters'", yaml: "nats: {subject: BOXCAR_DLQ.x}\n" + profile(""), schemaCannot: true},
		{name: "report out of the workdir", yaml: profile("report: ../r.md"), schemaCannot: true},
		{name: "a profile past its values", yaml: profile(toolSchema("{enum: [" + strings.Repeat("1, ", config.MaxProfileValues) + "1]}")), schemaCannot: true},
		{name: "a profile nested past its depth", yaml: profile(toolSchema(strings.Repeat("{a: ", config.MaxProfileDepth) + "1" + strings.Repeat("}", config.MaxProfileDepth))), schemaCannot: true},
	}
	// The CIDR keys: the schema refused nothing, so helm install took a mistake the worker
	// refused at start, in a crash loop.
	for _, c := range cidrCases {
		for _, key := range []string{"allowed_cidrs", "denied_cidrs", "nat64_prefixes"} {
			tests = append(tests, struct {
				name         string
				yaml         string
				schemaCannot bool
			}{name: key + " " + c, yaml: "egress: {" + key + ": ['" + c + "']}\n" + profile("")})
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, perr := config.Parse([]byte(tt.yaml))
			serr := schematest.ValidateYAML(v, []byte(tt.yaml))
			switch {
			case tt.schemaCannot:
				if perr == nil {
					t.Errorf("Parse accepts it, want it refused:\n%s", tt.yaml)
				}
				if serr != nil {
					t.Errorf("the schema now refuses it (%v): move the case up", serr)
				}
			case (perr == nil) != (serr == nil):
				t.Errorf("Parse and the schema disagree:\nParse:  %v\nschema: %v\n%s", perr, serr, tt.yaml)
			}
		})
	}
}

// cidrCases are prefixes and mistakes for the config's CIDR keys and the chart's (each read by
// netip.ParsePrefix in the worker, by the API server in a NetworkPolicy).
var cidrCases = []string{
	"10.20.0.0/16", "0.0.0.0/0", "255.255.255.255/32", "10.0.0.1/8", "fd00::/8", "::/0", "::1/128",
	"64:ff9b:1::/48", "2001:db8::/32", "2001:db8:0:0:0:0:0:1/128", "1:2:3:4:5:6:7::/64", "::1:2:3:4:5:6:7/112",
	"::ffff:10.0.0.0/104", "1:2:3:4:5:6:1.2.3.4/96", "64:ff9b::/96", "FD00::/8",
	"10.0.0.0/33", "10.0.0.0/08", "010.0.0.0/8", "256.0.0.0/8", "10.0.0/8", "10.0.0.1", "nodes", "",
	"fd00::/129", "fd00::", "fd00:::1/64", "1:2:3:4:5:6:7:8:9/64", "fe80::1%eth0/64", "10.0.0.0/+8",
	"::ffff:01.2.3.4/128", "g::/8", "10.0.0.0/8 ", "10.0.0.0/8,10.1.0.0/16",
}
