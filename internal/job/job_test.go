package job_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
)

const validSHA = "3b1db9b00b1e55df2519e5bacf13a2c3add9a92e88242af06aa9797eb7a903f0"

func valid() map[string]any {
	return map[string]any{
		"version":      1,
		"id":           "20261202t103908-0e9a4db02bea",
		"profile":      "csv-analyst",
		"task":         "analyse",
		"submitted_at": "2026-12-02T10:39:08Z",
		"inputs": []any{map[string]any{
			"name": "sales.csv", "uri": "file:///x/inputs/sha256/" + validSHA, "sha256": validSHA, "size": 411,
		}},
	}
}

func encode(t *testing.T, m map[string]any) []byte {
	t.Helper()
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func with(change func(m map[string]any)) func(t *testing.T) []byte {
	return func(t *testing.T) []byte {
		m := valid()
		change(m)
		return encode(t, m)
	}
}

func input(change func(in map[string]any)) func(m map[string]any) {
	return func(m map[string]any) {
		in := m["inputs"].([]any)[0].(map[string]any)
		change(in)
	}
}

func raw(s string) func(t *testing.T) []byte { return func(*testing.T) []byte { return []byte(s) } }

// spliced is the valid message with member (a key, its value and a comma) written first.
func spliced(member string) func(t *testing.T) []byte {
	return func(t *testing.T) []byte {
		return append([]byte("{"+member), encode(t, valid())[1:]...)
	}
}

func TestDecodeValid(t *testing.T) {
	j, err := job.Decode(encode(t, valid()))
	if err != nil {
		t.Fatal(err)
	}
	if j.ID != "20261202t103908-0e9a4db02bea" || j.Inputs[0].Size != 411 || !j.SubmittedAt.Equal(time.Date(2026, 12, 2, 10, 39, 8, 0, time.UTC)) {
		t.Errorf("decoded %+v", j)
	}
	again, err := j.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := job.Decode(again); err != nil {
		t.Errorf("re-encoded job does not decode: %v", err)
	}
	withLabels := valid()
	withLabels["labels"] = map[string]any{"team": "a", "env": "b"}
	if _, err := job.Decode([]byte(indented(withLabels))); err != nil {
		t.Errorf("the job with white space between its tokens does not decode: %v", err)
	}
}

// TestDecodeEscapes: escapes that are characters decode to them; the surrogate check reads
// escapes, not text that looks like one.
func TestDecodeEscapes(t *testing.T) {
	tests := []struct{ escaped, want string }{
		{`\ud83d\ude00`, "\U0001F600"},
		{`\uD83D\uDE00`, "\U0001F600"},
		{`\\udc00`, `\udc00`}, // a backslash, then the letters
		{`\\\ud83d\ude00`, "\\\U0001F600"},
		{`\ufffd`, "\uFFFD"},
		{`\u00e9\"`, "é\""},
	}
	for _, tt := range tests {
		t.Run(tt.escaped, func(t *testing.T) {
			msg := spliced(`"labels":{"team":"` + tt.escaped + `"},`)(t)
			j, err := job.Decode(msg)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if got := j.Labels["team"]; got != tt.want {
				t.Errorf("label = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestDecodeRejects lists malformed messages and what the operator reads about each: the
// rejection names the part of the message that is wrong.
func TestDecodeRejects(t *testing.T) {
	tests := []struct {
		name string
		msg  func(t *testing.T) []byte
		says string
	}{
		{"empty", raw(""), "EOF"},
		{"not json", raw("{not json"), "invalid character"},
		{"array", raw("[]"), "cannot unmarshal array"},
		{"string", raw(`"job"`), "cannot unmarshal string"},
		{"null", raw("null"), "version"},
		{"trailing data", raw(string(mustJSON(valid())) + " {}"), "trailing data"},
		{"unknown field", with(func(m map[string]any) { m["priority"] = 9 }), `unknown field "priority"`},
		{"unknown input field", with(input(func(in map[string]any) { in["path"] = "/etc/passwd" })), `unknown field "path"`},
		{"unknown limits field", with(func(m map[string]any) { m["limits"] = map[string]any{"sandbox": "host"} }), `unknown field "sandbox"`},
		{"version missing", with(func(m map[string]any) { delete(m, "version") }), "version"},
		{"version 2", with(func(m map[string]any) { m["version"] = 2 }), "version: got 2"},
		{"version string", with(func(m map[string]any) { m["version"] = "1" }), "version"},
		{"id missing", with(func(m map[string]any) { delete(m, "id") }), "id:"},
		{"id with slash", with(func(m map[string]any) { m["id"] = "../../etc/passwd" }), "id:"},
		{"id with dot dot", with(func(m map[string]any) { m["id"] = "abcdefgh-.." }), "id:"},
		{"id uppercase", with(func(m map[string]any) { m["id"] = "ABCDEFGH-1234" }), "id:"},
		{"id too short", with(func(m map[string]any) { m["id"] = "abc" }), "id:"},
		{"id too long", with(func(m map[string]any) { m["id"] = strings.Repeat("a", 65) }), "id:"},
		{"id with NUL", with(func(m map[string]any) { m["id"] = "abcdefgh\x00x" }), "id:"},
		{"id with NATS wildcard", with(func(m map[string]any) { m["id"] = "abcdefgh.>" }), "id:"},
		{"id of a rejected message", with(func(m map[string]any) { m["id"] = "stream-seq-42" }), `id: "stream-seq-42" begins with "stream-seq-"`},
		{"profile missing", with(func(m map[string]any) { delete(m, "profile") }), "profile:"},
		{"profile with path", with(func(m map[string]any) { m["profile"] = "../other" }), "profile:"},
		{"tenant uppercase", with(func(m map[string]any) { m["tenant"] = "Team-A" }), "tenant:"},
		{"tenant with dot", with(func(m map[string]any) { m["tenant"] = "team.a" }), "tenant:"},
		{"tenant wildcard", with(func(m map[string]any) { m["tenant"] = "*" }), "tenant:"},
		{"tenant too long", with(func(m map[string]any) { m["tenant"] = strings.Repeat("a", 33) }), "tenant:"},
		{"tenant with slash", with(func(m map[string]any) { m["tenant"] = "../b" }), "tenant:"},
		{"task missing", with(func(m map[string]any) { delete(m, "task") }), "task: is empty"},
		{"task blank", with(func(m map[string]any) { m["task"] = " \n\t" }), "task: is empty"},
		{"task number", with(func(m map[string]any) { m["task"] = 7 }), "task"},
		{"submitted_at missing", with(func(m map[string]any) { delete(m, "submitted_at") }), "submitted_at"},
		{"submitted_at garbage", with(func(m map[string]any) { m["submitted_at"] = "yesterday" }), "parsing time"},
		{"input name with slash", with(input(func(in map[string]any) { in["name"] = "../x.csv" })), "inputs[0].name"},
		{"input name absolute", with(input(func(in map[string]any) { in["name"] = "/etc/passwd" })), "inputs[0].name"},
		{"input name empty", with(input(func(in map[string]any) { in["name"] = "" })), "inputs[0].name"},
		{"input name hidden", with(input(func(in map[string]any) { in["name"] = ".bashrc" })), "inputs[0].name"},
		{"input sha short", with(input(func(in map[string]any) { in["sha256"] = "abc" })), "inputs[0].sha256"},
		{"input sha uppercase", with(input(func(in map[string]any) { in["sha256"] = strings.ToUpper(validSHA) })), "inputs[0].sha256"},
		{"input uri empty", with(input(func(in map[string]any) { in["uri"] = "" })), "inputs[0].uri"},
		{"input size negative", with(input(func(in map[string]any) { in["size"] = -1 })), "inputs[0].size"},
		{"input size fraction", with(input(func(in map[string]any) { in["size"] = 1.5 })), "size"},
		{"inputs twice", with(func(m map[string]any) {
			in := m["inputs"].([]any)[0]
			m["inputs"] = []any{in, in}
		}), "appears twice"},
		{"negative limit", with(func(m map[string]any) { m["limits"] = map[string]any{"max_turns": -1} }), "limits"},
		{"limit duration garbage", with(func(m map[string]any) { m["limits"] = map[string]any{"job_timeout": "forever"} }), `limits.job_timeout: time: invalid duration "forever"`},
		{"limit duration past int64", with(func(m map[string]any) { m["limits"] = map[string]any{"job_timeout": "99999999999h"} }), "limits.job_timeout: time: invalid duration"},
		{"job_timeout below a second", with(func(m map[string]any) { m["limits"] = map[string]any{"job_timeout": "999ms"} }), `limits.job_timeout: 999ms is below 1s`},
		{"limit duration a number", with(func(m map[string]any) { m["limits"] = map[string]any{"command_timeout": 90} }), `limits.command_timeout: duration must be a string such as "90s"`},
		{"limit duration null", with(func(m map[string]any) { m["limits"] = map[string]any{"command_timeout": nil} }), "limits.command_timeout"},
		{"network entry with a path", with(func(m map[string]any) { m["network"] = map[string]any{"allow": []any{"api.example.com/v1"}} }), "network.allow[0]"},
		{"network entry empty", with(func(m map[string]any) { m["network"] = map[string]any{"allow": []any{"a.example.com", ""}} }), "network.allow[1]"},
		{"network too many entries", with(func(m map[string]any) { m["network"] = map[string]any{"allow": make([]any, 65)} }), "network.allow"},
		{"unknown network field", with(func(m map[string]any) { m["network"] = map[string]any{"deny": []any{"x"}} }), `unknown field "deny"`},
		{"label key bad", with(func(m map[string]any) { m["labels"] = map[string]any{"Bad Key": "v"} }), "labels"},
		{"oversize", with(func(m map[string]any) { m["task"] = strings.Repeat("x", job.MaxMessageBytes) }), "limit is 65536"},
		// encoding/json takes the last of a key given twice and a key in any case for a field's:
		// another reader of the same bytes (a gateway, the schema) sees another job.
		{"id twice", spliced(`"id":"aaaaaaaa-first",`), `id: is given twice`},
		{"id twice, once escaped", spliced(`"\u0069d":"aaaaaaaa-first",`), `id: is given twice`},
		{"id twice among white space", raw(strings.Replace(indented(valid()), `"id"`, "\"id\":\n\t\"aaaaaaaa-first\" , \r\n \"id\"", 1)), `id: is given twice`},
		{"id in capitals", spliced(`"ID":"aaaaaaaa-other",`), `invalid job: "ID" is not a key of the job message`},
		{"key folded by Unicode", spliced(`"ſubmitted_by":"x",`), `"ſubmitted_by" is not a key`},
		{"input key twice", raw(strings.Replace(string(mustJSON(valid())), `"size":411`, `"size":411,"size":1`, 1)), `inputs[0].size: is given twice`},
		{"limit key in capitals", with(func(m map[string]any) { m["limits"] = map[string]any{"Max_Turns": 1} }), `limits: "Max_Turns" is not a key`},
		{"network key in capitals", with(func(m map[string]any) { m["network"] = map[string]any{"Allow": []any{}} }), `network: "Allow" is not a key`},
		{"label twice", spliced(`"labels":{"team":"a","team":"b"},`), `labels.team: is given twice`},
		{"label twice among many", spliced(`"labels":{` + manyLabels(20) + `,"k3":"again"},`), `labels.k3: is given twice`},
		{"input key twice after the first input", raw(strings.Replace(string(mustJSON(twoInputs())), `"size":7`, `"size":7,"size":1`, 1)), `inputs[1].size: is given twice`},
		// encoding/json would put U+FFFD in their place: the job run and recorded would not be
		// the bytes sent.
		{"submitted_by not UTF-8", spliced("\"submitted_by\":\"caf\xe9\","), "not UTF-8"},
		{"label value not UTF-8", spliced("\"labels\":{\"team\":\"\xff\"},"), "not UTF-8"},
		// A lone UTF-16 surrogate escaped in a string is no character: encoding/json puts U+FFFD
		// in its place, other readers keep it or refuse the message.
		{"lone low surrogate", spliced(`"submitted_by":"a\udc00b",`), `\udc00 at byte`},
		{"lone high surrogate", spliced(`"submitted_by":"a\ud800b",`), `\ud800 at byte`},
		{"high surrogate then a letter", spliced(`"submitted_by":"\ud800\u0041",`), `\ud800 at byte`},
		{"surrogates reversed", spliced(`"labels":{"team":"\udc00\ud800"},`), `\udc00 at byte`},
		{"high surrogate at the end", spliced(`"submitted_by":"\uD83D",`), `\uD83D at byte`},
	}
	if len(tests) < 30 {
		t.Fatalf("only %d malformed messages; keep at least 30", len(tests))
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := job.Decode(tt.msg(t))
			if !errors.Is(err, job.ErrInvalid) {
				t.Fatalf("Decode error = %v, want one wrapping ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.says) {
				t.Errorf("the operator reads %q; it should say %q", err, tt.says)
			}
		})
	}
}

func mustJSON(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return data
}

// TestTenant: a job without a tenant belongs to the default tenant; a well-formed one decodes
// and round-trips.
func TestTenant(t *testing.T) {
	tests := []struct {
		name   string
		tenant any
		want   string
	}{
		{name: "none", tenant: nil, want: job.DefaultTenant},
		{name: "empty", tenant: "", want: job.DefaultTenant},
		{name: "one character", tenant: "a", want: "a"},
		{name: "with a dash", tenant: "team-a", want: "team-a"},
		{name: "32 characters", tenant: strings.Repeat("t", 32), want: strings.Repeat("t", 32)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := valid()
			if tt.tenant != nil {
				m["tenant"] = tt.tenant
			}
			j, err := job.Decode(encode(t, m))
			if err != nil {
				t.Fatal(err)
			}
			if got := j.TenantOrDefault(); got != tt.want {
				t.Errorf("TenantOrDefault() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestNewIDIsValidAndUnique(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := job.NewID()
		if !job.ValidID(id) {
			t.Fatalf("NewID() = %q is not a valid id", id)
		}
		if seen[id] {
			t.Fatalf("NewID() repeated %q", id)
		}
		seen[id] = true
	}
}

// FuzzDecode: no input panics, and whatever Decode accepts re-encodes to a message that decodes
// to the same job.
func FuzzDecode(f *testing.F) {
	f.Add(mustJSON(valid()))
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":1,"id":"abcdefgh","profile":"p","task":"t","submitted_at":"2026-01-01T00:00:00Z","limits":{"job_timeout":"1s"}}`))
	f.Add([]byte("[]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		j, err := job.Decode(data)
		if err != nil {
			if !errors.Is(err, job.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		again, err := j.Encode()
		if err != nil {
			t.Fatalf("accepted job does not encode: %v", err)
		}
		j2, err := job.Decode(again)
		if err != nil {
			t.Fatalf("re-encoded job does not decode: %v", err)
		}
		if j2.ID != j.ID || j2.Task != j.Task || len(j2.Inputs) != len(j.Inputs) {
			t.Fatalf("round trip changed the job: %+v vs %+v", j, j2)
		}
	})
}

// FuzzValidID holds ValidID to the pattern it spells out.
func FuzzValidID(f *testing.F) {
	pattern := regexp.MustCompile(`^[a-z0-9][a-z0-9-]{7,63}$`)
	for _, id := range []string{
		job.NewID(), "abcdefgh", "abcdefg", "-bcdefgh", "a-------", "Abcdefgh", "abcdefgh\n", "abcd_efgh",
		strings.Repeat("a", 64), strings.Repeat("a", 65), "abcdefg\u00e9", "",
	} {
		f.Add(id)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if got, want := job.ValidID(id), pattern.MatchString(id); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", id, got, want)
		}
	})
}

// manyLabels is n labels, "k0":"v" to "k<n-1>":"v", as the members of an object.
func manyLabels(n int) string {
	members := make([]string, n)
	for i := range members {
		members[i] = fmt.Sprintf("%q:\"v\"", fmt.Sprintf("k%d", i))
	}
	return strings.Join(members, ",")
}

// twoInputs is a valid job message with a second input, of size 7.
func twoInputs() map[string]any {
	m := valid()
	in := maps.Clone(m["inputs"].([]any)[0].(map[string]any))
	in["name"], in["size"] = "second.csv", 7
	m["inputs"] = append(m["inputs"].([]any), in)
	return m
}

// indented is m as JSON with white space between its tokens.
func indented(m map[string]any) string {
	data, err := json.MarshalIndent(m, " ", "\t ")
	if err != nil {
		panic(err)
	}
	return string(data)
}
