package config

import (
	"fmt"
	"maps"
	"reflect"
	"strings"

	"github.com/boxcar-run/boxcar/internal/job"

	"github.com/boxcar-run/boxcar/internal/schemagen"
)

// SchemaOptions are the types and rules of the worker config's JSON Schema, generated from the
// Config type with schemagen: the rules restate Validate for the tools that read a schema (the
// Helm chart's values.schema.json, editors). A field written as its zero value takes its
// default, so a rule says "at least 0" where Validate says "at least 1" after defaults. What a
// tool kind requires is the agent's to add (agent.ToolSchema, which cmd/schemagen puts at
// "profiles.*.tools[]"). Some checks have no JSON Schema form: a tool name declared twice, a
// "{{param}}" without its parameter (the chart repeats these two in its templates), a tenant
// granted a profile the config does not define, two tenants sharing a bucket, a duration past
// MaxDuration, two nats keys naming one stream, a subject under the dead-letter stream's, a
// report or artifacts path out of the workdir, a secret in a URL key (the chart has its own
// rule, boxcar.checkURLSecrets), and worker_id and metrics_addr (the chart's to set).
// schema_test.go holds the schema to Validate.
func SchemaOptions() schemagen.Options {
	nonNegative := schemagen.Schema{"minimum": 0}
	atMostCalls := schemagen.Schema{"minimum": 0, "maximum": MaxCalls}
	quantity := schemagen.Schema{
		// YAML may write a quantity as a number; the pattern holds a string, the minimum a number.
		"type":             []any{"string", "number"},
		"pattern":          positiveQuantity,
		"exclusiveMinimum": 0,
		"description":      "A positive Kubernetes quantity such as 500m, 1, 512Mi or 1Gi; empty means the default.",
	}
	duration := schemagen.Schema{"pattern": nonNegativeDuration}
	o := schemagen.Options{
		YAMLScalars: true,
		Types: map[reflect.Type]schemagen.Schema{
			// No duration of the config may be negative (checkValues); the longest (MaxDuration)
			// has no pattern.
			reflect.TypeFor[Duration](): {"type": "string", "pattern": nonNegativeDuration, "description": "A Go duration such as 90s, 15m or 1h30m."},
		},
		Rules: map[string]schemagen.Schema{
			"concurrency":                          nonNegative,
			"sandbox.backend":                      {"enum": []any{"", "bubblewrap", "kubernetes"}},
			"sandbox.kubernetes.image_pull_policy": {"enum": []any{"", "Always", "IfNotPresent", "Never"}},
			"sandbox.kubernetes.instance":          {"pattern": labelValue.String()},
			"nats.ack_wait":                        duration,
			"nats.max_deliver":                     nonNegative,
			"nats.max_ack_pending":                 nonNegative,
			"nats.status_ttl":                      duration,
			"nats.job_max_msgs":                    nonNegative,
			"nats.job_max_bytes": {"anyOf": []any{schemagen.Schema{"const": 0}, schemagen.Schema{"minimum": job.MaxMessageBytes}},
				"description": "At least 65536, one job's largest message; 0 means the default (1 GiB)."},
			"nats.dead_letter_max_age":           duration,
			"nats.dead_letter_max_bytes":         nonNegative,
			"nats.cancel_max_bytes":              nonNegative,
			"nats.approvals_max_bytes":           nonNegative,
			"profiles":                           {"minProperties": 1, "propertyNames": schemagen.Schema{"pattern": job.NamePattern}},
			"profiles.*.model.name":              {"minLength": 1, "description": "The model the endpoint serves, e.g. gpt-4.1-mini."},
			"profiles.*.sandbox.cpu":             quantity,
			"profiles.*.sandbox.memory":          quantity,
			"profiles.*.sandbox.disk":            quantity,
			"profiles.*.sandbox.pids":            nonNegative,
			"profiles.*.sandbox.workdir":         {"pattern": `^(/[\s\S]+)?$`, "description": "An absolute path other than /."},
			"profiles.*.tools":                   {"minItems": 1},
			"profiles.*.tools[].name":            {"pattern": toolName.String()},
			"profiles.*.limits.max_turns":        atMostCalls,
			"profiles.*.limits.max_tool_calls":   atMostCalls,
			"profiles.*.limits.max_tokens":       nonNegative,
			"profiles.*.limits.max_output_bytes": {"anyOf": []any{schemagen.Schema{"const": 0}, schemagen.Schema{"minimum": 256}}, "description": "At least 256; 0 means the default."},
			"profiles.*.limits.max_conversation_bytes": {"anyOf": []any{schemagen.Schema{"const": 0}, schemagen.Schema{"minimum": MinConversationBytes}},
				"description": "At least 65536; 0 means the default (8 MiB)."},
			"profiles.*.limits.command_timeout": duration,
			"profiles.*.limits.job_timeout":     duration,

			"sandbox.kubernetes.image_pull_secrets[]": {"pattern": objectName.String()},
			"sandbox.kubernetes.network_policy":       {"enum": []any{"", NetworkPolicyDenyAll, NetworkPolicyNone}},
		},
	}
	maps.Copy(o.Rules, tenantRules())
	maps.Copy(o.Rules, nameRules())
	maps.Copy(o.Rules, countRules())
	return o
}

const (
	// nonNegativeDuration: zero takes the default, a negative one is refused.
	nonNegativeDuration = `^\+?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// positiveQuantity is a resource.Quantity above zero, or empty for the default.
	positiveQuantity = `^(\+?([0-9]*[1-9][0-9]*(\.[0-9]*)?|[0-9]*\.[0-9]*[1-9][0-9]*)([numkMGTPE]|[KMGTPE]i|[eE][+-]?[0-9]+)?)?$`
)

// tenantRules restate validateTenants.
func tenantRules() map[string]schemagen.Schema {
	nonNegative := schemagen.Schema{"minimum": 0}
	return map[string]schemagen.Schema{
		"tenants":                  {"propertyNames": schemagen.Schema{"pattern": job.TenantPattern}},
		"tenants.*.profiles":       {"minItems": 1, "description": "The profiles granted to the tenant; each one the config defines."},
		"tenants.*.max_concurrent": nonNegative,
		"tenants.*.daily_tokens":   nonNegative,
		"tenants.*.max_queued":     nonNegative,
		"tenants.*.max_queued_bytes": {"anyOf": []any{schemagen.Schema{"const": 0}, schemagen.Schema{"minimum": job.MaxMessageBytes}},
			"description": "At least 65536, one job's largest message; 0 means nats.job_max_bytes."},
		"tenants.*.bucket": {"pattern": `^([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])?$`},
	}
}

// nameRules restate the checks of the names the config gives NATS and Kubernetes (names.go,
// Kubernetes.validate); empty takes the default.
func nameRules() map[string]schemagen.Schema {
	jetStreamName := schemagen.Schema{"pattern": `^[^\s.*>/\\]{0,255}$`}
	bucket := schemagen.Schema{"pattern": `^[A-Za-z0-9_-]{0,250}$`}
	return map[string]schemagen.Schema{
		"nats.replicas":                {"minimum": 0, "maximum": maxReplicas},
		"nats.stream":                  {"pattern": fmt.Sprintf(`^[^\s.*>/\\]{0,%d}$`, maxJobStream)},
		"nats.dead_letter_stream":      {"pattern": fmt.Sprintf(`^[^\s.*>/\\]{0,%d}$`, maxJobStream)},
		"nats.consumer":                jetStreamName,
		"nats.status_bucket":           bucket,
		"nats.approvals_bucket":        bucket,
		"nats.subject":                 {"pattern": `^([^\s.*>]+(\.[^\s.*>]+)*)?$`},
		"sandbox.kubernetes.namespace": {"pattern": "^(" + strings.Trim(namespaceName.String(), "^$") + ")?$"},
		"sandbox.kubernetes.owner":     {"pattern": "^(" + strings.Trim(objectName.String(), "^$") + ")?$"},
	}
}

// countRules give countKeys their minimum of 0, and model.max_retries its NoRetries.
func countRules() map[string]schemagen.Schema {
	rules := map[string]schemagen.Schema{
		"model.max_retries": {"minimum": NoRetries, "description": "Retries of a failed model request: -1 for none, 0 for the default (3)."},
	}
	for _, key := range countKeys {
		rules[key] = schemagen.Schema{"minimum": 0}
	}
	return rules
}

// countKeys are counts and sizes with no rule of their own above: Validate refuses every
// negative integer of the config but a model's seed (checkValues).
var countKeys = []string{
	"profiles.*.model.max_completion_tokens",
	"profiles.*.limits.max_transcript_bytes",
	"profiles.*.limits.max_input_bytes",
	"profiles.*.warm.min",
	"profiles.*.warm.max",
	"egress.limits.max_requests",
	"egress.limits.max_bytes",
	"egress.limits.max_tunnels",
}
