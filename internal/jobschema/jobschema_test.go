package jobschema_test

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/jobschema"
	"github.com/boxcar-run/boxcar/internal/schemagen/schematest"
)

func compile(t *testing.T) *jsonschema.Schema {
	t.Helper()
	s, err := jobschema.Schema()
	if err != nil {
		t.Fatal(err)
	}
	return schematest.Compile(t, s)
}

// edit returns the example message with its JSON changed by f.
func edit(t *testing.T, f func(m map[string]any)) []byte {
	t.Helper()
	data, err := os.ReadFile("testdata/job.json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	f(m)
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func set(k string, v any) func(map[string]any) { return func(m map[string]any) { m[k] = v } }
func del(k string) func(map[string]any)        { return func(m map[string]any) { delete(m, k) } }
func setInput(k string, v any) func(map[string]any) {
	return func(m map[string]any) { m["inputs"].([]any)[0].(map[string]any)[k] = v }
}
func setLimit(k string, v any) func(map[string]any) {
	return func(m map[string]any) { m["limits"].(map[string]any)[k] = v }
}

// TestSchemaAgreesWithDecode: the published schema and the worker's job.Decode accept and
// refuse the same messages, apart from the two checks JSON Schema cannot state.
func TestSchemaAgreesWithDecode(t *testing.T) {
	v := compile(t)
	tests := []struct {
		name         string
		change       func(map[string]any)
		schemaCannot bool
	}{
		{name: "the documented example", change: func(map[string]any) {}},
		{name: "minimal", change: func(m map[string]any) {
			for _, k := range []string{"inputs", "limits", "labels", "submitted_by"} {
				delete(m, k)
			}
		}},
		{name: "input without size", change: func(m map[string]any) { delete(m["inputs"].([]any)[0].(map[string]any), "size") }},
		{name: "null limits", change: set("limits", nil)},
		{name: "a tenant", change: set("tenant", "team-a")},
		{name: "tenant uppercase", change: set("tenant", "Team-A")},
		{name: "tenant with a dot", change: set("tenant", "team.a")},
		{name: "tenant too long", change: set("tenant", strings.Repeat("t", 33))},
		{name: "time with offset and fraction", change: set("submitted_at", "2026-12-02T11:39:08.25+01:00")},

		{name: "version 2", change: set("version", 2)},
		{name: "no version", change: del("version")},
		{name: "uppercase id", change: set("id", "20261202T103908-0E9A4DB02BEA")},
		{name: "short id", change: set("id", "abc")},
		{name: "id of a rejected message", change: set("id", "stream-seq-42")},
		{name: "no id", change: del("id")},
		{name: "profile with a space", change: set("profile", "file summary")},
		{name: "blank task", change: set("task", " \n\t")},
		{name: "no task", change: del("task")},
		{name: "no submitted_at", change: del("submitted_at")},
		{name: "submitted_at not a time", change: set("submitted_at", "yesterday")},
		{name: "unknown field", change: set("priority", 5)},
		{name: "input name with a slash", change: setInput("name", "../etc/passwd")},
		{name: "input sha256 uppercase", change: setInput("sha256", strings.ToUpper("3b1db9b00b1e55df2519e5bacf13a2c3add9a92e88242af06aa9797eb7a903f0"))},
		{name: "input without uri", change: setInput("uri", "")},
		{name: "input size negative", change: setInput("size", -1)},
		{name: "input unknown field", change: setInput("mode", "0644")},
		{name: "negative max_turns", change: setLimit("max_turns", -1)},
		{name: "negative job_timeout", change: setLimit("job_timeout", "-5m")},
		{name: "job_timeout a number", change: setLimit("job_timeout", 300)},
		{name: "limit a job cannot set", change: setLimit("max_output_bytes", 10)},
		{name: "label key uppercase", change: set("labels", map[string]any{"Team": "x"})},
		{name: "label value a number", change: set("labels", map[string]any{"team": 5})},
		{name: "id in capitals", change: func(m map[string]any) { m["ID"] = m["id"]; delete(m, "id") }},
		{name: "input key in capitals", change: func(m map[string]any) {
			in := m["inputs"].([]any)[0].(map[string]any)
			in["SHA256"] = in["sha256"]
			delete(in, "sha256")
		}},

		{name: "input name twice", schemaCannot: true, change: func(m map[string]any) {
			in := m["inputs"].([]any)
			m["inputs"] = append(in, in[0])
		}},
		{name: "job_timeout below a second", schemaCannot: true, change: setLimit("job_timeout", "1ms")},
		{name: "over 64 KiB", schemaCannot: true, change: set("task", strings.Repeat("x", job.MaxMessageBytes))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := edit(t, tt.change)
			_, derr := job.Decode(msg)
			inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(msg))
			if err != nil {
				t.Fatal(err)
			}
			serr := v.Validate(inst)
			switch {
			case tt.schemaCannot:
				if derr == nil {
					t.Errorf("Decode accepts it, want it refused")
				}
				if serr != nil {
					t.Errorf("the schema now refuses it (%v): move the case up", serr)
				}
			case (derr == nil) != (serr == nil):
				t.Errorf("Decode and the schema disagree:\nDecode: %v\nschema: %v\n%s", derr, serr, msg)
			}
		})
	}
}
