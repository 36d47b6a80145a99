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

			"egress.allowed_cidrs[]":  CIDRSchema(),
			"egress.denied_cidrs[]":   CIDRSchema(),
			"egress.nat64_prefixes[]": {"pattern": "^" + ipv6 + "/(32|40|48|56|64|96)$", "description": "An IPv6 prefix of length 32, 40, 48, 56, 64 or 96 (RFC 6052), such as 64:ff9b:1::/48."},
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

// The address forms netip.ParseAddr reads, as patterns (RFC 3986's IPv4address and
// IPv6address, without a zone): an IPv4 address's parts have no leading zero.
var (
	ipv4 = func() string {
		octet := `(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])`
		return octet + `(\.` + octet + `){3}`
	}()
	ipv6 = func() string {
		const h16 = `[0-9A-Fa-f]{1,4}`
		ls32 := `(` + h16 + `:` + h16 + `|` + ipv4 + `)`
		forms := []string{`(` + h16 + `:){6}` + ls32}
		// After the "::", fewer groups the more stand before it.
		after := []string{`(` + h16 + `:){5}` + ls32, `(` + h16 + `:){4}` + ls32, `(` + h16 + `:){3}` + ls32,
			`(` + h16 + `:){2}` + ls32, h16 + `:` + ls32, ls32, h16, ``}
		for i, a := range after {
			before := ""
			switch {
			case i == 1:
				before = `(` + h16 + `)?`
			case i > 1:
				before = fmt.Sprintf(`((%s:){0,%d}%s)?`, h16, i-1, h16)
			}
			forms = append(forms, before+`::`+a)
		}
		return `(` + strings.Join(forms, `|`) + `)`
	}()
	// cidrPattern is a prefix as netip.ParsePrefix reads one: an address and a length of at
	// most its bits, written without a leading zero.
	cidrPattern = `^(` + ipv4 + `/(3[0-2]|[12]?[0-9])|` + ipv6 + `/(12[0-8]|1[01][0-9]|[1-9]?[0-9]))$`
)

// CIDRSchema is an IPv4 or IPv6 prefix such as 10.20.0.0/16 or fd00::/8, as the config's CIDR
// keys take one: the Helm chart's values.schema.json holds its NetworkPolicy's too to it (cmd/schemagen).
func CIDRSchema() schemagen.Schema {
	return schemagen.Schema{"type": "string", "pattern": cidrPattern, "description": "An IPv4 or IPv6 CIDR prefix, address/length, such as 10.20.0.0/16 or fd00::/8."}
}

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
