package submitcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
	"github.com/boxcar-run/boxcar/test/harness"
)

// setState moves a job's status on, as a worker would.
func (te *testEnv) setState(t *testing.T, id string, change func(*job.Status)) {
	t.Helper()
	if _, err := te.q.UpdateStatus(t.Context(), ref(id), change); err != nil {
		t.Fatal(err)
	}
}

// advertise publishes the example config's profiles as a live worker does, until the test ends.
func (te *testEnv) advertise(t *testing.T) { te.advertiseWith(t, "") }

// advertiseWith is advertise with the config's tenants: section (YAML) added.
func (te *testEnv) advertiseWith(t *testing.T, tenants string) {
	t.Helper()
	cfg, err := config.Parse(append(append([]byte{}, examples.Config...), tenants...))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = te.q.AdvertiseProfiles(ctx, "worker-1", cfg.Profiles, cfg.TenantsOrDefault())
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the worker's profiles", func() bool {
		_, err := te.c.LiveProfiles(t.Context())
		return err == nil
	})
}

func TestList(t *testing.T) {
	te := newTestEnv(t)
	a := te.submitJob(t, "--label", "team=data")
	b := te.submitJob(t, "--label", "team=ops")
	c := te.submitJob(t, "--label", "team=data")
	// As a worker's claim writes them: the job's labels and when it was submitted. c is still
	// queued: no status, so no labels a list could filter by (submit writes none).
	now := time.Now()
	te.setState(t, a, func(s *job.Status) {
		s.State, s.Labels, s.QueuedAt = job.StateSucceeded, map[string]string{"team": "data"}, now.Add(-3*time.Second)
	})
	te.setState(t, b, func(s *job.Status) {
		s.State, s.Attempt, s.Labels, s.QueuedAt = job.StateRunning, 1, map[string]string{"team": "ops"}, now.Add(-2*time.Second)
	})

	ids := func(stdout string) []string {
		var out struct {
			Jobs []struct{ ID string } `json:"jobs"`
			Next string                `json:"next"`
		}
		if err := json.Unmarshal([]byte(stdout), &out); err != nil {
			t.Fatalf("list -o json: %v\n%s", err, stdout)
		}
		var got []string
		for _, j := range out.Jobs {
			got = append(got, j.ID)
		}
		if out.Next != "" {
			got = append(got, "next="+out.Next)
		}
		return got
	}
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"all, newest first", nil, []string{c, b, a}},
		{"state", []string{"--state", "succeeded,running"}, []string{b, a}},
		{"label", []string{"--label", "team=data"}, []string{a}},
		{"profile", []string{"--profile", "other"}, nil},
		{"since", []string{"--since", "1h"}, []string{c, b, a}},
		{"first page", []string{"--limit", "2"}, []string{c, b, "next=" + b}},
		{"second page", []string{"--limit", "2", "--before", b}, []string{a}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, err := te.submit(t, append([]string{"list", "-o", "json"}, tt.args...)...)
			if err != nil {
				t.Fatalf("list: %v\n%s", err, stderr)
			}
			if got := ids(stdout); strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Errorf("list %v = %v, want %v", tt.args, got, tt.want)
			}
		})
	}
	stdout, _, err := te.submit(t, "list", "--state", "running")
	if err != nil || !strings.Contains(stdout, b) || strings.Contains(stdout, a) || !strings.Contains(stdout, "running") {
		t.Errorf("list --state running: %v\n%s", err, stdout)
	}
	if _, _, err := te.submit(t, "list", "--state", "sleeping"); exitCode(err) != 1 || !strings.Contains(message(err), "not a state") {
		t.Errorf("list --state sleeping: %v; want a usage error", err)
	}
}

func TestLogs(t *testing.T) {
	te := newTestEnv(t)
	transcript, err := os.ReadFile(filepath.Join("testdata", "transcript.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	id := job.NewID()
	te.commitRunAs(t, id, true, map[string][]byte{"transcript.jsonl": transcript})
	te.setState(t, id, func(s *job.Status) {
		s.State, s.Attempt, s.Worker, s.Progress = job.StateRunning, 1, "worker-1", "starting sandbox"
	})
	te.setState(t, id, func(s *job.Status) { s.Progress = "tool call 1 of 30: csv_stats" })
	// A running job's logs show its current step (earlier ones are readable only through a
	// consumer, which a tenant's identity may not create).
	if stdout, _, err := te.submit(t, "logs", id); err != nil || !strings.Contains(stdout, "running (attempt 1 on worker-1): tool call 1 of 30: csv_stats") {
		t.Errorf("logs of a running job: %v\n%s", err, stdout)
	}
	te.setState(t, id, func(s *job.Status) {
		s.State, s.Progress, s.Manifest = job.StateSucceeded, "", provenance.ManifestKey(id)
	})

	stdout, stderr, err := te.submit(t, "logs", id)
	if err != nil || !strings.Contains(stderr, "checked transcript.jsonl against the manifest's sha256 digest, a manifest signed by key") {
		t.Fatalf("logs: %v\n%s", err, stderr)
	}
	for _, want := range []string{
		"succeeded (attempt 1 on worker-1)",
		"turn 1: model answered (tool_calls, 120 tokens, 812 ms) calls csv_stats, shell",
		"calls csv_stats, shell\n  Looking at the data.\n", // the model's text on lines of its own
		`tool csv_stats ["csv_stats","sales.csv"]: exit 0 (31 ms)`,
		`tool shell ["sleep","100"]: timed out (30000 ms, 4200 ms waiting for approval, approved by ana@desk)`,
		`[egress] {"decision":"denied","host":"pypi.org"}`,
		"end: succeeded after 2 turns, 2 tool calls, 300 tokens",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("logs does not show %q:\n%s", want, stdout)
		}
	}
	stdout, _, err = te.submit(t, "logs", id, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	// Numbers as written: the transcript holds one float64 cannot (1e400), which must come
	// through as it is.
	var events []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var v map[string]any
		dec := json.NewDecoder(strings.NewReader(l))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("line %q is not JSON: %v", l, err)
		}
		events = append(events, v)
	}
	if !strings.Contains(stdout, `"rows":1e400`) {
		t.Errorf("logs -o json does not keep the number 1e400 as the transcript has it:\n%s", stdout)
	}
	if n := len(events); n != 1+6 || events[n-1]["source"] != "transcript" || events[0]["source"] != "status" {
		t.Errorf("logs -o json: %d events, want the current status step then 6 transcript events:\n%s", n, stdout)
	}

	// A running job: --follow shows the steps as they come, says that no signature covers
	// them, and shows the transcript, checked, once the run commits.
	run := te.submitJob(t)
	var out, errOut harness.LogBuffer
	done := make(chan error, 1)
	go func() {
		done <- Run(t.Context(), []string{"logs", run, "--follow"}, te.getenv, &out, &errOut)
	}()
	waitFor(t, "logs --follow to show the queued job", func() bool { return strings.Contains(out.String(), "queued") })
	te.setState(t, run, func(s *job.Status) { s.State, s.Attempt, s.Progress = job.StateRunning, 1, "turn 1" })
	// Steps are read every 250 ms: one replaced sooner may not show, so the test waits for it.
	waitFor(t, "logs --follow to show turn 1", func() bool { return strings.Contains(out.String(), "turn 1") })
	te.commitRunAs(t, run, true, map[string][]byte{"transcript.jsonl": transcript}, func(m *provenance.Manifest) { m.Outcome.State = job.StateFailed })
	te.setState(t, run, func(s *job.Status) {
		s.State, s.Progress, s.Manifest = job.StateFailed, "", provenance.ManifestKey(run)
	})
	err = <-done
	for _, want := range []string{"turn 1", "failed", "end: succeeded after 2 turns"} {
		if err != nil || !strings.Contains(out.String(), want) {
			t.Errorf("logs --follow: %v, want %q shown\n%s", err, want, out.String())
		}
	}
	if e := errOut.String(); !strings.Contains(e, "which no signature covers") || !strings.Contains(e, "a manifest signed by key") {
		t.Errorf("logs --follow does not say what no signature covers and what it checked:\n%s", e)
	}
}

func TestProfilesAndUnknownProfile(t *testing.T) {
	te := newTestEnv(t)
	input := writeTestFile(t, t.TempDir(), "sales.csv", "region,total\n")

	// No worker has published its profiles: run cannot check, says so, and submits.
	stdout, stderr, err := te.submit(t, "run", "--profile", "nope", "--task", "t", "--input", input)
	if err != nil || !strings.Contains(stderr, "could not check the profile") || !job.ValidID(strings.TrimSpace(stdout)) {
		t.Fatalf("run without published profiles: %v, %q; want it submitted with a warning", err, stderr)
	}
	if _, _, err := te.submit(t, "profiles"); exitCode(err) != 1 || !strings.Contains(message(err), "no live worker") {
		t.Errorf("profiles without workers: %v", err)
	}

	te.advertise(t)
	stdout, _, err = te.submit(t, "profiles", "-o", "json")
	if err != nil || !strings.Contains(stdout, `"name":"csv-analyst"`) || !strings.Contains(stdout, `"workers":["worker-1"]`) {
		t.Errorf("profiles -o json: %v\n%s", err, stdout)
	}
	stdout, _, err = te.submit(t, "profiles")
	if err != nil || !strings.Contains(stdout, "csv-analyst") {
		t.Errorf("profiles: %v\n%s", err, stdout)
	}

	// An unknown profile is refused before anything reaches the store or the stream.
	for _, dir := range []string{"inputs"} {
		_ = os.RemoveAll(filepath.Join(te.storeDir, "tenants", "default", dir))
	}
	before := te.jobMessages(t)
	other := writeTestFile(t, t.TempDir(), "other.csv", "a,b\n")
	_, stderr, err = te.submit(t, "run", "--profile", "nope", "--task", "t", "--input", other, "-o", "json")
	var e struct {
		Code     string `json:"code"`
		ExitCode int    `json:"exit_code"`
		Message  string `json:"message"`
	}
	if jerr := json.Unmarshal([]byte(stderr), &e); jerr != nil || exitCode(err) != exitRejected || e.Code != codeUnknownProfile || !strings.Contains(e.Message, "csv-analyst") {
		t.Errorf("run --profile nope: exit %d, stderr %q; want exit 4 and code unknown_profile naming the profiles there are", exitCode(err), stderr)
	}
	if keys := listKeys(t, te.st, "inputs/"); len(keys) != 0 || te.jobMessages(t) != before {
		t.Errorf("an unknown profile still uploaded %v or queued a job", keys)
	}
	if _, _, err := te.submit(t, "run", "--jobs", writeTestFile(t, t.TempDir(), "jobs.jsonl", `{"profile":"csv-analyst","task":"a"}`+"\n"+`{"profile":"nope","task":"b"}`+"\n")); exitCode(err) != exitRejected {
		t.Errorf("run --jobs with an unknown profile: %v; want exit 4 before anything is submitted", err)
	}
	if te.jobMessages(t) != before {
		t.Error("run --jobs with an unknown profile queued jobs")
	}
}

func TestCompleteJobIDsAndProfiles(t *testing.T) {
	te := newTestEnv(t)
	te.advertise(t)
	id := te.submitJob(t)
	for _, args := range [][]string{{"__complete", "status", ""}, {"__complete", "logs", id[:4]}, {"__complete", "approve", ""}} {
		stdout, _, err := te.submit(t, args...)
		// ":4" is cobra's "no file completion": a job id is never a file name.
		if err != nil || !strings.Contains(stdout, id+"\tqueued") || !strings.HasSuffix(strings.TrimSpace(stdout), ":4") {
			t.Errorf("%v: %v\n%s", args, err, stdout)
		}
	}
	stdout, _, err := te.submit(t, "__complete", "approve", id, "")
	if err != nil || strings.Contains(stdout, id) || !strings.HasSuffix(strings.TrimSpace(stdout), ":4") {
		t.Errorf("approve's second argument (a call id) offers job ids or files: %v\n%s", err, stdout)
	}
	stdout, _, err = te.submit(t, "__complete", "run", "--profile", "")
	if err != nil || !strings.Contains(stdout, "csv-analyst\t") {
		t.Errorf("completing run --profile: %v\n%s", err, stdout)
	}
}

func TestJSONEverywhere(t *testing.T) {
	te := newTestEnv(t)
	dir := t.TempDir()
	for _, args := range [][]string{{"version", "-o", "json"}, {"keygen", "--out", filepath.Join(dir, "keys"), "-o", "json"}} {
		stdout, _, err := te.submit(t, args...)
		var v map[string]any
		if err != nil || json.Unmarshal([]byte(stdout), &v) != nil || len(v) == 0 {
			t.Errorf("%v: %v; stdout %q is not one JSON object", args, err, stdout)
		}
	}
	id := te.commitRun(t, false)
	stdout, _, err := te.submit(t, "get", id, "--out", filepath.Join(dir, "run"), "-o", "json")
	if v := lastJSON(t, stdout); err != nil || v["id"] != id || len(v["files"].([]any)) != 3 {
		t.Errorf("get -o json: %v\n%s", err, stdout)
	}

	tests := []struct {
		name string
		args []string
		code string
		exit int
	}{
		{"unknown command", []string{"statu", "-o", "json"}, codeUsage, 1},
		{"unknown flag", []string{"status", "--nope", "--output=json"}, codeUsage, 1},
		{"argument count", []string{"status", "-o", "json"}, codeUsage, 1},
		{"unknown job", []string{"status", "20261202t101500-abcdef012345", "-o", "json"}, codeUnknownJob, 1},
		{"no run", []string{"get", "20261202t101500-abcdef012345", "--out", dir, "-o", "json"}, codeNotCommitted, 1},
		{"gave up", []string{"watch", te.submitJob(t), "--timeout", "10ms", "-o", "json"}, codeTimeout, exitGaveUp},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, stderr, err := te.submit(t, tt.args...)
			e := jsonError(t, stderr)
			code, forMain := ExitCode(err)
			if e.Code != tt.code || e.ExitCode != tt.exit || code != tt.exit || e.Message == "" || forMain != "" {
				t.Errorf("error %+v, exit %d, message for main %q; want code %s, exit %d, printed once", e, code, forMain, tt.code, tt.exit)
			}
		})
	}
}

func TestDidYouMean(t *testing.T) {
	_, _, err := noEnv(t, "statu", "x")
	if msg := message(err); exitCode(err) != 1 || !strings.Contains(msg, `did you mean "status"?`) || strings.Contains(msg, `\n`) || strings.Contains(msg, "\n") {
		t.Errorf("unknown command: %q; want one line suggesting status", msg)
	}
}

// TestRunRidesOutJetStreamOutage: JetStream stops answering (as during a leader election),
// then the server is stopped and started again; run waits, says for what, and queues the job
// once.
func TestRunRidesOutJetStreamOutage(t *testing.T) {
	te := newTestEnv(t)
	if err := te.ns.DisableJetStream(); err != nil {
		t.Fatal(err)
	}
	var stderr harness.LogBuffer
	var stdout bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- Run(t.Context(), []string{"run", "--profile", "csv-analyst", "--task", "t", "--timeout", "2m"}, te.getenv, &stdout, &stderr)
	}()
	waitFor(t, "run to say it waits for JetStream", func() bool { return strings.Contains(stderr.String(), "waiting for NATS JetStream") })
	te.restart(t) // a server with JetStream again, on the same files
	if err := <-done; err != nil {
		t.Fatalf("run across a JetStream outage: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "answered after") || te.jobMessages(t) != 1 || !job.ValidID(strings.TrimSpace(stdout.String())) {
		t.Errorf("run: stdout %q, stderr %q, %d jobs queued; want one, and what it waited for", stdout.String(), stderr.String(), te.jobMessages(t))
	}
}

// TestStartAWorkerOnlyWhenMissing: "start a worker first" when the stream is really not there.
func TestStartAWorkerOnlyWhenMissing(t *testing.T) {
	ns := queuetest.Start(t, queue.EmbeddedOptions{})
	getenv := func(k string) string {
		return map[string]string{"NATS_URL": ns.ClientURL(), "BOXCAR_HOME": t.TempDir()}[k]
	}
	var stderr bytes.Buffer
	err := Run(t.Context(), []string{"status", "20261202t101500-abcdef012345"}, getenv, &bytes.Buffer{}, &stderr)
	if exitCode(err) != 1 || !strings.Contains(message(err), "start a worker first") || strings.Contains(stderr.String(), "waiting") {
		t.Errorf("no stream: %v, %q; want at once: start a worker first", err, stderr.String())
	}
}

func TestBatchProgressLineWithinASecond(t *testing.T) {
	te := newTestEnv(t)
	file := writeTestFile(t, t.TempDir(), "jobs.jsonl", `{"profile":"csv-analyst","task":"a"}`+"\n"+`{"profile":"csv-analyst","task":"b"}`+"\n")
	var stdout, stderr harness.LogBuffer
	done := make(chan error, 1)
	go func() {
		done <- Run(t.Context(), []string{"run", "--jobs", file, "--wait"}, te.getenv, &stdout, &stderr)
	}()
	waitFor(t, "the first progress line", func() bool { return strings.Contains(stderr.String(), "2 jobs: 2 queued") })
	lines := jsonLines(t, stdout.String())
	a, b := lines[0]["id"].(string), lines[1]["id"].(string)
	// Two changes in quick succession, then none: the line must still catch up.
	te.setState(t, a, func(s *job.Status) { s.State = job.StateSucceeded })
	te.setState(t, b, func(s *job.Status) { s.State = job.StateRunning })
	waitFor(t, "the progress line to show both changes", func() bool { return strings.Contains(stderr.String(), "2 jobs: 1 running, 1 succeeded") })
	te.setState(t, b, func(s *job.Status) { s.State = job.StateSucceeded })
	if err := <-done; err != nil {
		t.Fatalf("run --jobs --wait: %v\n%s", err, stderr.String())
	}
}

// cliError is an error as --output json prints it on stderr.
type cliError struct {
	Code     string `json:"code"`
	Message  string `json:"message"`
	ExitCode int    `json:"exit_code"`
}

// jsonError reads the JSON object an error is on stderr with --output json: its last line,
// after any warnings, and the only JSON line.
func jsonError(t *testing.T, stderr string) cliError {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	var e cliError
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &e); err != nil || strings.Count(stderr, "{") != 1 {
		t.Fatalf("the last line of stderr is not the one JSON object: %v\n%s", err, stderr)
	}
	return e
}

// TestWatchJSONStream: watch -o json is one JSON event per status change, the final one last;
// in a pipe (not a terminal) progress stays line-based.
func TestWatchJSONStream(t *testing.T) {
	te := newTestEnv(t)
	id := te.submitJob(t)
	var stdout, stderr harness.LogBuffer
	done := make(chan error, 1)
	go func() { done <- Run(t.Context(), []string{"watch", id, "-o", "json"}, te.getenv, &stdout, &stderr) }()
	waitFor(t, "the queued event", func() bool { return strings.Contains(stdout.String(), `"state":"queued"`) })
	te.setState(t, id, func(s *job.Status) { s.State, s.Attempt = job.StateRunning, 1 })
	waitFor(t, "the running event", func() bool { return strings.Contains(stdout.String(), `"state":"running"`) })
	te.setState(t, id, func(s *job.Status) { s.State = job.StateSucceeded })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var states []string
	for _, ev := range jsonLines(t, stdout.String()) {
		states = append(states, ev["state"].(string))
	}
	if strings.Join(states, " ") != "queued running succeeded" || stderr.String() != "" {
		t.Errorf("watch -o json: states %v, stderr %q; want one event per change, nothing else", states, stderr.String())
	}

	// Interrupted (as by Ctrl-C): exit 130, and the job is left as it is.
	other := te.submitJob(t)
	ctx, cancel := context.WithCancel(t.Context())
	var errOut harness.LogBuffer
	go func() { done <- Run(ctx, []string{"watch", other}, te.getenv, &bytes.Buffer{}, &errOut) }()
	waitFor(t, "the progress line", func() bool { return strings.Contains(errOut.String(), "queued") })
	cancel()
	err := <-done
	if exitCode(err) != exitInterrupted || !strings.Contains(message(err), "keeps running") || strings.Contains(message(err), "after") {
		t.Errorf("watch interrupted: exit %d, %q; want 130 saying the job keeps running", exitCode(err), message(err))
	}
}
