package runner_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// TestEgressLinesWithinTheTranscriptCap: max_transcript_bytes bounds the whole transcript,
// the egress lines the runner appends after the run's included. A run that fills all the
// agent may write (Profile.Limits.MaxTranscriptBytes, as the agent is given it) and makes 1,010
// requests the proxy refuses (past the 1,000 decision lines kept) leaves a transcript of at most
// max_transcript_bytes, ending with the egress_summary line, which counts every request and
// the decision lines left out; the manifest's summary counts them all.
func TestEgressLinesWithinTheTranscriptCap(t *testing.T) {
	t.Parallel()
	const limit = 256 << 10
	const requests = 1010
	b := setup(t)
	cfg, err := config.Parse([]byte(strings.Replace(egressProfiles, "network: {allow: [api.boxcar.test]}",
		fmt.Sprintf("network: {allow: [api.boxcar.test]}\n    limits: {max_transcript_bytes: %d}", limit), 1)))
	if err != nil {
		t.Fatal(err)
	}
	b.cfg = cfg
	up := egressUpstream(t, func(string) {})
	var given int64 // what the agent was given to write
	w := b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		// Refused: the name is not allowed. Each is one decision line; eight at a time.
		var g errgroup.Group
		g.SetLimit(8)
		for range requests {
			g.Go(func() error {
				_, err := req.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: []string{"https://other.boxcar.test/" + strings.Repeat("x", 100)}})
				return err
			})
		}
		if err := g.Wait(); err != nil {
			return agent.Result{}, err
		}
		given = req.Profile.Limits.MaxTranscriptBytes
		fill(t, req.Transcript, given)
		return writeReport(ctx, req)
	}), func(c *runner.Config) {
		c.Sandboxes = &egressProvider{}
		c.LookupEnv = func(k string) (string, bool) { return "real-api-token-0123456789abcdef", k == "BOXCAR_TEST_API_TOKEN" }
		c.Egress = up
	})
	_ = w
	j := b.submit("net")
	if st := b.waitFinal(j.ID, 5*time.Minute); st.State != job.StateSucceeded {
		t.Fatalf("job ended %s: %s", st.State, st.Error)
	}
	transcript := b.runFile(j.ID, "transcript.jsonl")
	lines := bytes.Split(bytes.TrimSuffix(transcript, []byte("\n")), []byte("\n"))
	var egressLines int
	for _, l := range lines {
		if bytes.HasPrefix(l, []byte(`{"type":"egress",`)) {
			egressLines++
		}
	}
	var sum struct {
		Type         string `json:"type"`
		Requests     int    `json:"requests"`
		Denied       int    `json:"denied"`
		DroppedLines int    `json:"dropped_lines"`
	}
	_ = json.Unmarshal(lines[len(lines)-1], &sum)
	t.Logf("the agent was given %d bytes; the transcript holds %d bytes, %d egress lines, summary %+v", given, len(transcript), egressLines, sum)
	if len(transcript) > limit {
		t.Errorf("the transcript holds %d bytes, over max_transcript_bytes %d (the agent was given %d; %d egress lines)", len(transcript), limit, given, egressLines)
	}
	if sum.Type != "egress_summary" || sum.Denied != requests || egressLines+sum.DroppedLines != requests {
		t.Errorf("the transcript's last line %.300s, with %d egress lines; want the egress_summary of %d refused requests counting those left out", lines[len(lines)-1], egressLines, requests)
	}
	if m := b.manifest(j.ID).Predicate.Egress; m == nil || m.Denied != requests {
		t.Errorf("manifest egress %+v; want %d refused requests", m, requests)
	}
}

// fill writes JSON lines to w, n bytes in all (n of at least a line's 25).
func fill(t *testing.T, w interface{ Write([]byte) (int, error) }, n int64) {
	const frame = len(`{"type":"filler","x":""}` + "\n")
	for n > 0 {
		size := min(n, 4096)
		if rest := n - size; rest > 0 && rest < int64(frame) {
			size -= int64(frame)
		}
		line := `{"type":"filler","x":"` + strings.Repeat("f", int(size)-frame) + "\"}\n"
		if _, err := w.Write([]byte(line)); err != nil {
			t.Error(err)
			return
		}
		n -= int64(len(line))
	}
}

// TestManifestCountsClosedUnread: the requests the proxy closed unread past max_requests are
// in the signed manifest's egress as in the transcript's egress_summary line: the manifest
// left them out, so a job that hammered the proxy past its cap read as one that stopped.
func TestManifestCountsClosedUnread(t *testing.T) {
	t.Parallel()
	const execs = 5
	b := egressSetup(t)
	up := egressUpstream(t, func(string) {})
	up.Limits.MaxRequests = 2 // the first command's CONNECT and GET; the second's CONNECT is refused
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		for range execs { // each a new connection: the three past the refusal are closed unread
			if _, err := req.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: []string{"https://api.boxcar.test/v1"}}); err != nil {
				return agent.Result{}, err
			}
		}
		return writeReport(ctx, req)
	}), func(c *runner.Config) {
		c.Sandboxes = &egressProvider{}
		c.LookupEnv = func(k string) (string, bool) { return "real-api-token-0123456789abcdef", k == "BOXCAR_TEST_API_TOKEN" }
		c.Egress = up
	})
	j := b.submit("net")
	if st := b.waitFinal(j.ID, time.Minute); st.State != job.StateSucceeded {
		t.Fatalf("job ended %s: %s", st.State, st.Error)
	}
	lines := bytes.Split(bytes.TrimSuffix(b.runFile(j.ID, "transcript.jsonl"), []byte("\n")), []byte("\n"))
	var sum struct {
		Type         string `json:"type"`
		ClosedUnread int64  `json:"closed_unread"`
	}
	_ = json.Unmarshal(lines[len(lines)-1], &sum)
	if sum.Type != "egress_summary" || sum.ClosedUnread != execs-2 {
		t.Fatalf("the transcript's last line %.300s; want the egress_summary with closed_unread %d", lines[len(lines)-1], execs-2)
	}
	if m := b.manifest(j.ID).Predicate.Egress; m == nil || m.ClosedUnread != sum.ClosedUnread {
		t.Errorf("manifest egress %+v; want closed_unread %d, as the transcript's summary", m, sum.ClosedUnread)
	}
}
