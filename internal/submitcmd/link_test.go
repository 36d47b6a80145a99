package submitcmd

import (
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestFollowSaysNATSIsLost: while NATS does not answer, watch, run --wait and logs --follow
// say so (and that the job is not lost, and how to follow it again) instead of showing the
// last status as if nothing happened; they say when it answers again and follow on.
func TestFollowSaysNATSIsLost(t *testing.T) {
	tests := []struct {
		name  string
		args  func(id string) []string
		again string // how to follow it again, as the notice says
	}{
		{"watch", func(id string) []string { return []string{"watch", id} }, "submit watch "},
		{"watch json", func(id string) []string { return []string{"watch", id, "-o", "json"} }, "submit watch "},
		{"run --wait", func(id string) []string {
			return []string{"run", "--profile", "csv-analyst", "--task", "t", "--id", id, "--wait"}
		}, "submit watch "},
		{"logs --follow", func(id string) []string { return []string{"logs", id, "--follow"} }, "submit logs "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			te := newTestEnv(t)
			id := te.submitJob(t)
			var stdout, stderr harness.LogBuffer
			done := make(chan error, 1)
			go func() { done <- Run(t.Context(), tt.args(id), te.getenv, &stdout, &stderr) }()
			waitFor(t, "the queued job", func() bool { return strings.Contains(stdout.String()+stderr.String(), "queued") })
			te.ns.Shutdown() // restart starts it again on its port
			waitFor(t, "word that NATS is lost", func() bool { return strings.Contains(stderr.String(), "lost NATS") })
			if s := stderr.String(); !strings.Contains(s, "not lost") || !strings.Contains(s, tt.again+id) {
				t.Errorf("the notice does not say the job is not lost and how to follow it again:\n%s", s)
			}
			te.restart(t)
			waitFor(t, "word that NATS answered again", func() bool { return strings.Contains(stderr.String(), "answered again") })
			te.commitRunAs(t, id, true, nil) // the run logs shows when the job ends
			te.setState(t, id, func(s *job.Status) { s.State = job.StateSucceeded })
			if err := <-done; err != nil {
				t.Errorf("%v\n%s", err, stderr.String())
			}
		})
	}
}
