package submitcmd

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/test/harness"
)

func lastJSON(t *testing.T, stdout string) map[string]any {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	var v map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &v); err != nil {
		t.Fatalf("last line of stdout is not JSON: %v\n%s", err, stdout)
	}
	return v
}

// submitJob runs `submit run` without --wait and returns the job id it printed.
func (te *testEnv) submitJob(t *testing.T, args ...string) string {
	t.Helper()
	stdout, stderr, err := te.submit(t, append([]string{"run", "--profile", "csv-analyst", "--task", "Summarise"}, args...)...)
	if err != nil {
		t.Fatalf("submit run: %v\n%s", err, stderr)
	}
	id := strings.TrimSpace(stdout)
	if !job.ValidID(id) {
		t.Fatalf("submit run printed %q, want a job id", stdout)
	}
	return id
}

// jobMessages counts the messages on the job stream.
func (te *testEnv) jobMessages(t *testing.T) int {
	t.Helper()
	s, err := te.js.Stream(t.Context(), "BOXCAR_JOBS_default")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return int(info.State.Msgs)
}

func TestRun(t *testing.T) {
	te := newTestEnv(t)
	input := filepath.Join(t.TempDir(), "sales.csv")
	if err := os.WriteFile(input, []byte("region,total\nnorth,3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	id := te.submitJob(t, "--input", input, "--label", "team=finance")

	// The input is in the store under its digest, and the status says queued.
	sum := sha256.Sum256([]byte("region,total\nnorth,3\n"))
	if _, err := te.st.Stat(t.Context(), store.InputKey(hex.EncodeToString(sum[:]))); err != nil {
		t.Errorf("input not in the store: %v", err)
	}
	// No worker runs: the job waits in its tenant's consumer. The server counts a consumer's
	// pending messages a moment after the publish's ack, so the count may read 0 at first.
	var stdout string
	var err error
	waitFor(t, "the status to count the job waiting", func() bool {
		stdout, _, err = te.submit(t, "status", id)
		return err == nil && strings.Contains(stdout, "1 waiting")
	})
	if err != nil || !strings.Contains(stdout, "state:    queued") || !strings.Contains(stdout, "queue:    tenant default, 1 waiting, 0 running of at most 64") {
		t.Errorf("status = %v\n%s", err, stdout)
	}
	stdout, _, err = te.submit(t, "status", id, "--output", "json")
	if st := lastJSON(t, stdout); err != nil || st["id"] != id || st["state"] != "queued" {
		t.Errorf("status --output json = %v, %v", st, err)
	}
	if n := te.jobMessages(t); n != 1 {
		t.Errorf("job stream holds %d messages, want 1", n)
	}

	stdout, _, err = te.submit(t, "run", "--profile", "csv-analyst", "--task", "t", "--output", "json")
	if st := lastJSON(t, stdout); err != nil || st["state"] != "queued" || !job.ValidID(st["id"].(string)) {
		t.Errorf("run --output json = %v, %v", st, err)
	}

	// Nobody runs it: --wait gives up with exit 7 and says why.
	_, stderr, err := te.submit(t, "run", "--profile", "csv-analyst", "--task", "t", "--wait", "--timeout", "300ms")
	if exitCode(err) != exitGaveUp || !strings.Contains(message(err), "no worker has started it") || !strings.Contains(stderr, "submitted job") {
		t.Errorf("run --wait with no worker: exit %d, %q\n%s", exitCode(err), message(err), stderr)
	}
	if _, _, err := te.submit(t, "status", "20261202t101500-abcdef012345"); exitCode(err) != 1 || !strings.Contains(message(err), "20261202t101500-abcdef012345") {
		t.Errorf("status of an unknown job: %v", err)
	}
}

// TestWatchExitCodes: how a job ended is the exit code of watch, and the last line says so.
func TestWatchExitCodes(t *testing.T) {
	te := newTestEnv(t)
	tests := []struct {
		state  job.State
		cap    string
		code   int
		stdout string
	}{
		{job.StateSucceeded, "", 0, "succeeded"},
		{job.StateFailed, "", exitFailed, "failed"},
		{job.StateCapped, "max_turns", exitCapped, "capped (cap reached: max_turns)"},
		{job.StateRejected, "", exitRejected, "rejected"},
		{job.StateCancelled, "", exitCancelled, "cancelled"},
		{job.StateDead, "", exitDead, "dead"},
	}
	for _, tt := range tests {
		t.Run(string(tt.state), func(t *testing.T) {
			id := te.submitJob(t)
			if _, err := te.q.UpdateStatus(t.Context(), ref(id), func(st *job.Status) {
				st.State, st.Cap, st.Error = tt.state, tt.cap, ""
			}); err != nil {
				t.Fatal(err)
			}
			stdout, _, err := te.submit(t, "watch", id)
			if exitCode(err) != tt.code || !strings.Contains(stdout, "job "+id+" "+tt.stdout) {
				t.Errorf("watch: exit %d (%v), want %d\n%s", exitCode(err), err, tt.code, stdout)
			}
			stdout, _, err = te.submit(t, "watch", id, "--output", "json")
			if st := lastJSON(t, stdout); exitCode(err) != tt.code || st["state"] != string(tt.state) {
				t.Errorf("watch --output json: exit %d, %v", exitCode(err), st)
			}
		})
	}
	// A job that ends while it is watched.
	id := te.submitJob(t)
	var stderr harness.LogBuffer
	type result struct {
		stdout string
		err    error
	}
	watched := make(chan result, 1)
	go func() {
		stdout, err := te.submitStderr(t, &stderr, "watch", id)
		watched <- result{stdout, err}
	}()
	// The watch has read the job's first status when it shows it: it then waits for the next.
	waitFor(t, "the watch to show the job queued", func() bool { return strings.Contains(stderr.String(), "queued") })
	for _, edit := range []func(*job.Status){
		func(st *job.Status) { st.State, st.Worker, st.Attempt = job.StateRunning, "w1", 1 },
		func(st *job.Status) { st.State = job.StateSucceeded },
	} {
		if _, err := te.q.UpdateStatus(t.Context(), ref(id), edit); err != nil {
			t.Fatal(err)
		}
	}
	if r := <-watched; r.err != nil || !strings.Contains(r.stdout, "succeeded") {
		t.Errorf("watch of a job that ends: %v\n%s\n%s", r.err, r.stdout, stderr.String())
	}
	if _, _, err := te.submit(t, "watch", "20261202t101500-abcdef012345"); exitCode(err) != 1 {
		t.Errorf("watch of an unknown job: %v", err)
	}
}

func TestCancel(t *testing.T) {
	te := newTestEnv(t)
	id := te.submitJob(t)
	stdout, _, err := te.submit(t, "cancel", id)
	if err != nil || !strings.Contains(stdout, "job "+id+": cancel requested; it will not start") {
		t.Errorf("cancel a queued job: %v\n%s", err, stdout)
	}
	// submit writes no status; a worker records the cancel (runner's cancel watch).
	if _, err := te.q.UpdateStatus(t.Context(), ref(id), job.RequestCancel); err != nil {
		t.Fatal(err)
	}
	if _, _, err := te.submit(t, "cancel", id); exitCode(err) != 1 || !strings.Contains(message(err), "already ended: cancelled") {
		t.Errorf("cancel twice: %v", err)
	}
	running := te.submitJob(t)
	if _, err := te.q.UpdateStatus(t.Context(), ref(running), func(st *job.Status) { st.State = job.StateRunning }); err != nil {
		t.Fatal(err)
	}
	stdout, _, err = te.submit(t, "cancel", running, "--output", "json")
	if st := lastJSON(t, stdout); err != nil || st["id"] != running {
		t.Errorf("cancel a running job: %v, %v", err, st)
	}
	if _, _, err := te.submit(t, "cancel", "20261202t101500-abcdef012345"); exitCode(err) != 1 {
		t.Errorf("cancel an unknown job: %v", err)
	}
}

// TestApprovalsShowWhatIsSigned: `submit approvals` lists a request by its key, not by what a
// body written under another key claims, and says what it skipped; `submit approve` shows the
// command it signs before it signs, and with the --revision listed refuses a request that
// changed since.
func TestApprovalsShowWhatIsSigned(t *testing.T) {
	te := newTestEnv(t)
	id := te.submitJob(t)
	danger := []string{"rm", "-rf", "/work"}
	now := time.Now().UTC()
	asked := queue.Approval{Tenant: "default", JobID: id, CallID: "call_real", Argv: danger, RequestedAt: now, ExpiresAt: now.Add(time.Hour)}
	if _, err := te.q.RequestApproval(t.Context(), asked); err != nil {
		t.Fatal(err)
	}
	// Anyone who may write the tenant's approvals puts, under a key of its own, a body naming
	// the real request with a harmless command.
	decoy := asked
	decoy.Argv, decoy.RequestedAt = []string{"ls"}, now.Add(-time.Second)
	data, _ := json.Marshal(decoy)
	kv, err := te.js.KeyValue(t.Context(), queue.ApprovalsBucket(config.Config{}.WithDefaults().NATS, job.DefaultTenant))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(t.Context(), "default."+id+".decoy", data); err != nil {
		t.Fatal(err)
	}

	stdout, stderr, err := te.submit(t, "approvals", id)
	if err != nil || strings.Count(stdout, "call_real") != 1 || !strings.Contains(stdout, `["rm","-rf","/work"]`) || strings.Contains(stdout, `["ls"]`) {
		t.Errorf("approvals: %v\n%s", err, stdout)
	}
	if !strings.Contains(stderr, "skipped default."+id+".decoy") || !strings.Contains(stderr, "--revision REVISION") {
		t.Errorf("approvals' stderr does not name the skipped key and --revision:\n%s", stderr)
	}
	stdout, _, err = te.submit(t, "approvals", id, "--output", "json")
	var listed struct {
		Approvals []struct {
			CallID   string   `json:"call_id"`
			Argv     []string `json:"argv"`
			Revision uint64   `json:"revision"`
		} `json:"approvals"`
		Skipped []queue.SkippedApproval `json:"skipped"`
	}
	if err != nil || json.Unmarshal([]byte(stdout), &listed) != nil || len(listed.Approvals) != 1 || listed.Approvals[0].Revision == 0 || len(listed.Skipped) != 1 {
		t.Fatalf("approvals --output json: %v\n%s", err, stdout)
	}
	shown := strconv.FormatUint(listed.Approvals[0].Revision, 10)

	// The worker asks another command under the call before the person answers what was listed.
	asked.Argv = []string{"make", "test"}
	again, err := te.q.RequestApproval(t.Context(), asked)
	if err != nil {
		t.Fatal(err)
	}
	current := strconv.FormatUint(again.Revision, 10)
	tests := []struct {
		name       string
		args       []string
		code       int
		want       string // in stdout and the error's message
		wantStderr string
	}{
		{name: "the revision listed, changed since", args: []string{"approve", id, "call_real", "--yes", "--revision", shown}, code: 1, want: "list it again"},
		{name: "the decoy's key", args: []string{"approve", id, "decoy", "--yes"}, code: 1, want: "names another request than its key"},
		{name: "the decoy's key, as JSON", args: []string{"deny", id, "decoy", "--yes", "--output", "json"}, code: 1, wantStderr: `"code":"approval_misfiled"`},
		{name: "the current revision", args: []string{"approve", id, "call_real", "--yes", "--revision", current}, code: 0,
			want: `approved call call_real of job ` + id + `: ["make","test"]`, wantStderr: "signing approved of call call_real of job " + id + ", revision " + current + `: ["make","test"]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, err := te.submit(t, tt.args...)
			if exitCode(err) != tt.code || !strings.Contains(stdout+message(err), tt.want) || !strings.Contains(stderr, tt.wantStderr) {
				t.Errorf("submit %s: exit %d, %q\n%s\n%s; want exit %d, %q and %q on stderr", strings.Join(tt.args, " "), exitCode(err), message(err), stdout, stderr, tt.code, tt.want, tt.wantStderr)
			}
		})
	}
}

func TestApprovals(t *testing.T) {
	te := newTestEnv(t)
	stdout, _, err := te.submit(t, "approvals")
	if err != nil || !strings.Contains(stdout, "no commands are waiting") {
		t.Errorf("approvals with none: %v\n%s", err, stdout)
	}
	stdout, _, err = te.submit(t, "approvals", "--output", "json")
	if err != nil || strings.TrimSpace(stdout) != `{"approvals":[]}` {
		t.Errorf("approvals --output json with none: %v\n%s", err, stdout)
	}
	id := te.submitJob(t)
	now := time.Now()
	for _, call := range []string{"call_1", "call_2"} {
		if _, err := te.q.RequestApproval(t.Context(), queue.Approval{Tenant: "default", JobID: id, CallID: call, Argv: []string{"make", "test"}, RequestedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	stdout, _, err = te.submit(t, "approvals", id)
	if err != nil || !strings.Contains(stdout, id) || !strings.Contains(stdout, `["make","test"]`) || strings.Count(stdout, "call_") != 2 {
		t.Errorf("approvals: %v\n%s", err, stdout)
	}
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"approve", id, "call_1", "--yes"}, 0, "approved call call_1 of job " + id},
		{[]string{"approve", id, "call_1", "--yes"}, 1, "already"},
		{[]string{"deny", id, "call_1", "--yes", "--reason", "no"}, 1, "already"},
		{[]string{"deny", id, "call_2", "--yes", "--reason", "not today"}, 0, "denied call call_2"},
		{[]string{"approve", id, "call_9", "--yes"}, 1, "call_9"},
	}
	for _, tt := range tests {
		stdout, _, err := te.submit(t, tt.args...)
		if exitCode(err) != tt.code || !strings.Contains(stdout+message(err), tt.want) {
			t.Errorf("submit %s: exit %d, %q\n%s; want exit %d and %q", strings.Join(tt.args, " "), exitCode(err), message(err), stdout, tt.code, tt.want)
		}
	}
}

// TestWatchUnknownJob: watch says a job is unknown (no status, not in the job stream) once it
// has stayed so for queue.UnknownGrace, exit 1 and code unknown_job, and follows a job published
// within the grace: the watch of a job id printed a moment before its publish was confirmed
// failed at once with "unknown job".
func TestWatchUnknownJob(t *testing.T) {
	te := newTestEnv(t)
	start := time.Now()
	_, stderr, err := te.submit(t, "watch", "20261202t101500-abcdef012345", "-o", "json")
	if e := jsonError(t, stderr); exitCode(err) != 1 || e.Code != codeUnknownJob || !strings.Contains(e.Message, "job stream does not hold it") {
		t.Errorf("watch of a job never submitted: exit %d, %+v; want 1, %s, saying why", exitCode(err), e, codeUnknownJob)
	}
	if took := time.Since(start); took > queue.UnknownGrace+10*time.Second {
		t.Errorf("watch of a job never submitted took %s; want about the grace, %s", took, queue.UnknownGrace)
	}

	// The watch starts first: it has looked for the job in the job stream, found nothing, and
	// looks again.
	id := job.NewID()
	looked := harness.Requested(t, te.js.Conn(), "$JS.API.STREAM.INFO.BOXCAR_JOBS_default", id, 2)
	done := make(chan error, 1)
	go func() { _, _, err := te.submit(t, "watch", id); done <- err }()
	looked()
	te.submitJob(t, "--id", id)
	te.setState(t, id, func(s *job.Status) { s.State = job.StateSucceeded })
	if err := <-done; err != nil {
		t.Errorf("watch of a job published within the grace: %v; want it followed to its end", err)
	}
}

// TestWatchJobThatLeftTheStream: a job watch saw queued that then leaves the job stream with
// no status (purged by an operator) is unknown once it has stayed so for queue.UnknownGrace:
// exit 1, code unknown_job, saying it was queued and left the stream. The watch waited for a
// worker's status until its --timeout.
func TestWatchJobThatLeftTheStream(t *testing.T) {
	te := newTestEnv(t)
	id := te.submitJob(t)
	var stdout, stderr harness.LogBuffer
	done := make(chan error, 1)
	go func() {
		done <- Run(t.Context(), []string{"watch", id, "--timeout", "60s", "-o", "json"}, te.getenv, &stdout, &stderr)
	}()
	// The watch prints each status as a line as it sees it: queued is its first look in the
	// job stream, which must come before the purge (a first look after it sees a job never
	// submitted, and says so).
	waitFor(t, "the watch to see the job queued", func() bool {
		return strings.Contains(stdout.String(), `"state":"queued"`) || len(done) > 0
	})
	if len(done) > 0 {
		t.Fatalf("the watch ended before it saw the job queued: %v\n%s%s", <-done, stdout.String(), stderr.String())
	}
	stream, err := te.js.Stream(t.Context(), "BOXCAR_JOBS_default")
	if err != nil {
		t.Fatal(err)
	}
	purged := time.Now()
	if err := stream.Purge(t.Context(), jetstream.WithPurgeSubject("boxcar.jobs.default."+id)); err != nil {
		t.Fatal(err)
	}
	err = <-done
	if e := jsonError(t, stderr.String()); exitCode(err) != 1 || e.Code != codeUnknownJob || !strings.Contains(e.Message, "left the job stream") {
		t.Errorf("watch of a purged job: exit %d, %+v; want 1, %s, saying it left the job stream", exitCode(err), e, codeUnknownJob)
	}
	if took := time.Since(purged); took > queue.UnknownGrace+10*time.Second {
		t.Errorf("watch of a purged job ended %s after the purge; want about the grace, %s", took, queue.UnknownGrace)
	}
}

// TestApprovalsShowTheCommandAsItRuns: the command a person is asked to approve is shown as it
// runs, its redirects and && too, in the list, in the status of its job, in approve's question
// and answer, and in the job's logs: each showed ["sh","-c","make \u003e log \u0026\u0026 rm -rf /work"], JSON's
// HTML escapes, hiding the very characters that say what a shell line does.
func TestApprovalsShowTheCommandAsItRuns(t *testing.T) {
	te := newTestEnv(t)
	id := te.submitJob(t)
	now := time.Now().UTC()
	argv := []string{"sh", "-c", "make > log && rm -rf /work <in"}
	if _, err := te.q.RequestApproval(t.Context(), queue.Approval{Tenant: "default", JobID: id, CallID: "call_1", Argv: argv, RequestedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	const shown = `["sh","-c","make > log && rm -rf /work <in"]`
	block := blockLines(job.Status{ID: id, State: job.StateRunning}, queue.ProfileInfo{}, []queue.Approval{{JobID: id, CallID: "call_1", Argv: argv, Revision: 1}}, now)
	if !strings.Contains(strings.Join(block, "\n"), shown) {
		t.Errorf("status and watch show the job's request as\n%s\nwant %s", strings.Join(block, "\n"), shown)
	}
	// logs shows the transcript's tool call, and an event it has no view of, the same way.
	for _, ev := range []map[string]any{{"type": "tool_call", "tool": "shell", "argv": []any{"sh", "-c", argv[2]}, "exit_code": 0}, {"type": "new_kind", "argv": []any{"sh", "-c", argv[2]}}} {
		if got := describeEvent(ev); !strings.Contains(got, `"make > log && rm -rf /work <in"`) {
			t.Errorf("logs shows %v as %s", ev, got)
		}
	}
	for _, args := range [][]string{{"approvals", id}, {"approve", id, "call_1", "--yes"}} {
		stdout, stderr, err := te.submit(t, args...)
		if err != nil || !strings.Contains(stdout, shown) || args[0] == "approve" && !strings.Contains(stderr, shown) {
			t.Errorf("submit %s: %v; want %s shown\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, shown, stdout, stderr)
		}
	}
}
