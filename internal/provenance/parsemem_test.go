package provenance_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/provenance"
)

// parseBudget is the most bytes a reader may allocate to parse any manifest or envelope up to
// the 16 MiB it reads of one: whoever may write the store chooses what is in it.
const parseBudget = 64 << 20

// maxDocBytes is what a reader reads of a manifest or an envelope (16 MiB).
const maxDocBytes = 16 << 20

// TestParseMemoryIsBounded: a manifest or envelope of up to 16 MiB that a writer of the store
// made, however its lists and unknown members are shaped, costs its reader (get, verify, logs,
// the worker adopting a run) at most parseBudget bytes allocated to parse, counted by the
// runtime (TotalAlloc, a count, not a time). On main, protojson built a structpb tree of every
// value: a 16 MiB unknown array cost about 70 times its size.
func TestParseMemoryIsBounded(t *testing.T) {
	good := string(build(t, sampleManifest(t), sampleSubjects()))
	fill := func(prefix, item string) string {
		n := (maxDocBytes - len(good) - 64) / len(item)
		return prefix + strings.Repeat(item, n)
	}
	labels := func() string {
		var b strings.Builder
		for i := 0; b.Len() < maxDocBytes-len(good)-64; i++ {
			fmt.Fprintf(&b, `"l%d":"",`, i)
		}
		return b.String()
	}
	tests := []struct {
		name, old, new string
	}{
		{"an unknown array in the predicate", `"predicate":{`, fill(`"predicate":{"x":[`, "0,") + `0],`},
		{"an unknown array in the statement", `{"_type"`, fill(`{"x":[`, "0,") + `0],"_type"`},
		{"nested unknown arrays", `"predicate":{`, fill(`"predicate":{"x":[`, "[],") + `0],`},
		{"an unknown member in the profile", `"spec":{`, fill(`"spec":{"x":[`, "{},") + `0],`},
		{"empty tool calls", `"tool_calls":[`, fill(`"tool_calls":[`, "{},")},
		{"empty response ids", `"response_ids":[`, fill(`"response_ids":[`, `"",`)},
		{"empty model calls", `"predicate":{`, fill(`"predicate":{"usage":{"model_calls":[`, "{},") + `{}]},`},
		{"empty skipped files", `"predicate":{`, fill(`"predicate":{"collected":{"skipped":[`, "{},") + `{}]},`},
		{"empty inputs", `"inputs":[`, fill(`"inputs":[`, "{},")},
		{"empty egress hosts", `"predicate":{`, fill(`"predicate":{"egress":{"hosts":[`, "{},") + `{}]},`},
		{"empty subjects", `"subject":[`, fill(`"subject":[`, "{},")},
		{"labels", `"labels":{`, `"labels":{` + labels()},
	}
	// The most a reader takes: every capped list at its most, and as many other values as it
	// takes, each as small as JSON writes it.
	m := sampleManifest(t)
	m.Usage = &provenance.RunUsage{ModelCalls: []provenance.ModelCall{{Turn: 1}}}
	m.ToolCalls, m.Model.ResponseIDs = m.ToolCalls[:1], m.Model.ResponseIDs[:1]
	m.Job.Labels = map[string]string{"a": ""}
	most := string(build(t, m, withArtifacts(provenance.MaxArtifacts)))
	for _, edit := range []struct{ old, new string }{
		{`"tool_calls":[`, `"tool_calls":[` + strings.Repeat("{},", provenance.MaxCalls-1)},
		{`"response_ids":[`, `"response_ids":[` + strings.Repeat(`"",`, provenance.MaxCalls-1)},
		{`"model_calls":[`, `"model_calls":[` + strings.Repeat("{},", provenance.MaxCalls-1)},
		{`"predicate":{`, `"predicate":{"egress":{"hosts":[` + strings.Repeat("{},", provenance.MaxEgressHosts-1) + `{}]},`},
		{`"predicate":{`, `"predicate":{"x":[` + strings.Repeat("0,", 1<<16-1000) + `0],`},
	} {
		most = strings.Replace(most, edit.old, edit.new, 1)
	}
	if _, err := provenance.Parse([]byte(most)); err != nil {
		t.Fatalf("Parse of the largest manifest it takes: %v", err)
	}
	tests = append(tests, struct{ name, old, new string }{"every list at its most", good, most})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := []byte(strings.Replace(good, tt.old, tt.new, 1))
			if string(data) == good {
				t.Fatal("the edit did not change the manifest")
			}
			if len(data) > maxDocBytes {
				t.Fatalf("the manifest is %d bytes, more than a reader reads", len(data))
			}
			var err error
			allocated := allocatedBy(func() { _, err = provenance.Parse(data) })
			t.Logf("%d bytes: %d bytes allocated (%.1fx), %v", len(data), allocated, float64(allocated)/float64(len(data)), err)
			if allocated > parseBudget {
				t.Errorf("Parse of a %d-byte manifest allocated %d bytes (%.0fx), more than %d", len(data), allocated, float64(allocated)/float64(len(data)), parseBudget)
			}
		})
	}
}

// TestEnvelopeMemoryIsBounded: the same of a DSSE envelope of 16 MiB of empty signatures,
// each a check on main, and the envelope parsed again for each key of the ring.
func TestEnvelopeMemoryIsBounded(t *testing.T) {
	_, pub := keys(t)
	prefix := `{"payloadType":"application/vnd.in-toto+json","payload":"e30=","signatures":[`
	data := []byte(prefix + strings.Repeat(`{},`, (maxDocBytes-len(prefix))/3-1) + `{}]}`)
	var err error
	allocated := allocatedBy(func() { _, err = provenance.VerifyEnvelope(context.Background(), data, pub) })
	t.Logf("%d bytes: %d bytes allocated (%.1fx), %v", len(data), allocated, float64(allocated)/float64(len(data)), err)
	if allocated > parseBudget {
		t.Errorf("VerifyEnvelope of a %d-byte envelope allocated %d bytes, more than %d", len(data), allocated, parseBudget)
	}
}

// allocatedBy is the bytes the runtime allocated while f ran (the test runs nothing beside it).
func allocatedBy(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
