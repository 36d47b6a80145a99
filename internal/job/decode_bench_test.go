package job_test

import (
	"encoding/json"
	"testing"

	"github.com/boxcar-run/boxcar/internal/job"
)

// BenchmarkDecode is a job as the worker reads it from every delivery.
func BenchmarkDecode(b *testing.B) {
	m := valid()
	m["labels"] = map[string]any{"team": "finance", "env": "test"}
	m["limits"] = map[string]any{"max_turns": 5, "command_timeout": "90s"}
	data, err := json.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := job.Decode(data); err != nil {
			b.Fatal(err)
		}
	}
}
