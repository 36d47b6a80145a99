//go:build integration

package agent_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// TestSandboxSetUpFailureNamesNoHostPath: a command real bubblewrap cannot set up (its image
// folder was removed after the sandbox started) fails, and the model is told so, without the
// host's paths that bwrap's words hold (the image's, the worker's data dir with the sandbox's
// workdir): neither the requests to the model nor the transcript hold them, and the worker's
// log keeps bwrap's words with the job's id.
func TestSandboxSetUpFailureNamesNoHostPath(t *testing.T) {
	image := sandboxtest.SearchableTempDir(t)
	if err := os.Mkdir(image+"/bin", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(image, 0o755); err != nil { // the sandbox's host user reads the image
		t.Fatal(err)
	}
	var root string
	p := sandboxtest.Bubblewrap(t, func(c *sandbox.BubblewrapConfig) { root = c.Root })
	sb := sandboxtest.StartSpec(t, p, config.SandboxSpec{Image: image})
	if err := os.RemoveAll(image); err != nil {
		t.Fatal(err)
	}
	s := newScript(t, toolCalls(100, call{"c1", "emit", `{"text": "x"}`}), final("done"))
	var logs bytes.Buffer
	req := request(csvProfile(t, emitTool), sb)
	res, err := newAgent(t, s, func(c *agent.Config) { c.Logger = jsonLogger(&logs) }).Run(context.Background(), req)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	reqs := s.requests()
	if len(reqs) != 2 {
		t.Fatalf("the model was asked %d times, want 2", len(reqs))
	}
	got := lastToolResult(t, reqs[1])
	if msg, _ := got["error"].(string); !strings.HasPrefix(msg, "failed: the command could not run") {
		t.Errorf("the model got %v; want the command's failure", got)
	}
	for _, host := range []string{image, root} {
		for i, r := range reqs {
			if strings.Contains(string(r.raw), host) {
				t.Errorf("request %d to the model names the host path %s: %v", i+1, host, got)
			}
		}
		if strings.Contains(string(res.Transcript), host) {
			t.Errorf("the transcript names the host path %s", host)
		}
	}
	var found bool
	for _, l := range strings.Split(logs.String(), "\n") {
		found = found || (strings.Contains(l, image) && strings.Contains(l, req.JobID))
	}
	if !found {
		t.Errorf("no line of the worker's log names the image's path and the job:\n%s", logs.String())
	}
}
