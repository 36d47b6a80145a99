// Package jobschema is the JSON Schema of the job message, for teams that publish jobs
// without `submit`. It is generated from job.Job; the rules restate job.Validate (internal/job
// imports nothing of the repository, so they live here), and jobschema_test.go holds the two
// to each other. Two checks have no JSON Schema form: an input name used twice, and the
// 64 KiB limit on the encoded message.
package jobschema

import (
	"reflect"
	"strconv"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/schemagen"
)

// The patterns of job.Validate.
const (
	idPattern    = `^[a-z0-9][a-z0-9-]{7,63}$`
	sha256Hex    = `^[0-9a-f]{64}$`
	labelPattern = `^[a-z0-9][a-z0-9._/-]{0,62}$`
	// nonNegativeDuration is what time.ParseDuration reads, without a minus sign.
	nonNegativeDuration = `^\+?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
)

// Schema returns the schema of version job.Version of the job message.
func Schema() (schemagen.Schema, error) {
	nonNegative := schemagen.Schema{"minimum": 0}
	s, err := schemagen.Generate(job.Job{}, schemagen.Options{
		Types: map[reflect.Type]schemagen.Schema{
			reflect.TypeFor[job.Duration](): {"type": "string", "pattern": nonNegativeDuration, "description": "A Go duration such as 90s or 15m; 0 means the profile's value."},
		},
		Rules: map[string]schemagen.Schema{
			"version": {"const": job.Version},
			"id": {"pattern": idPattern, "not": schemagen.Schema{"pattern": "^" + job.SeqIDPrefix},
				"description": "Lowercase letters, digits and '-', 8 to 64 characters, starting with a letter or digit, not beginning " + job.SeqIDPrefix +
					" (the name of a rejected message). The last token of the message's subject (boxcar.jobs.TENANT.ID) must be the same id."},
			"profile": {"pattern": job.NamePattern, "description": "An execution profile the workers define."},
			"tenant": {"pattern": job.TenantPattern, "description": "The tenant the job belongs to. Informational: the worker takes the tenant " +
				"from the subject the message was published on (boxcar.jobs.TENANT.ID) and overwrites this field."},
			"task":         {"pattern": `\S`, "description": "What the agent is asked to do; not blank."},
			"submitted_at": {"description": "RFC 3339 time the job was submitted."},
			// encoding/json leaves a missing size at 0, which is valid.
			"inputs[]":      {"required": []any{"name", "uri", "sha256"}},
			"inputs[].name": {"pattern": job.NamePattern, "description": "A plain file name, unique among the inputs; the file's name in the sandbox."},
			"inputs[].uri": {"minLength": 1, "description": "The file's URL in the workers' store, as submit writes it (s3://BUCKET/PREFIX/inputs/sha256/SHA256). " +
				"Recorded, not read: the worker reads the object inputs/sha256/SHA256 under its store."},
			"inputs[].sha256":       {"pattern": sha256Hex, "description": "Lowercase hex SHA-256 of the file; checked when it is copied in."},
			"inputs[].size":         {"minimum": 0, "description": "The file's size in bytes; checked when it is copied in, so give it for any file that is not empty."},
			"limits":                {"description": "Limits that may only tighten the profile's; 0 or absent means the profile's value."},
			"limits.max_turns":      nonNegative,
			"limits.max_tool_calls": nonNegative,
			"limits.max_tokens":     nonNegative,
			"labels":                {"propertyNames": schemagen.Schema{"pattern": labelPattern}, "additionalProperties": schemagen.Schema{"type": "string"}},
		},
	})
	if err != nil {
		return nil, err
	}
	s["$schema"] = "http://json-schema.org/draft-07/schema#"
	s["title"] = "Boxcar job message, version " + strconv.Itoa(job.Version)
	s["description"] = "One job, published as JSON on the subject boxcar.jobs.TENANT.ID (the jobs subject, default boxcar.jobs, " +
		"its tenant and its id). At most " + strconv.Itoa(job.MaxMessageBytes) + " bytes; input names unique."
	return s, nil
}
