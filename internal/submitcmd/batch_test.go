package submitcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/store"
)

// jsonLines parses every line of stdout.
func jsonLines(t *testing.T, stdout string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var v map[string]any
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("line %q is not JSON: %v", l, err)
		}
		out = append(out, v)
	}
	return out
}

func writeTestFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRunJobs(t *testing.T) {
	te := newTestEnv(t)
	dir := t.TempDir()
	sales := writeTestFile(t, dir, "sales.csv", "region,total\nnorth,3\n")
	same := writeTestFile(t, dir, "copy.csv", "region,total\nnorth,3\n") // same bytes, another name
	other := writeTestFile(t, dir, "costs.csv", "region,cost\nnorth,1\n")
	lines := []string{
		fmt.Sprintf(`{"profile":"csv-analyst","task":"one","inputs":[%q]}`, sales),
		``, // blank lines are skipped
		fmt.Sprintf(`{"profile":"csv-analyst","task":"two","inputs":[%q,%q],"labels":{"team":"finance"}}`, sales, other),
		fmt.Sprintf(`{"profile":"csv-analyst","task":"three","inputs":[%q],"id":"batch-three-0001"}`, same),
		`{"profile":"csv-analyst","task":"four"}`,
	}
	file := writeTestFile(t, dir, "jobs.jsonl", strings.Join(lines, "\n")+"\n")
	stdout, stderr, err := te.submit(t, "run", "--jobs", file)
	if err != nil {
		t.Fatalf("run --jobs: %v\n%s", err, stderr)
	}
	got := jsonLines(t, stdout)
	if len(got) != 4 {
		t.Fatalf("%d lines, want one per job:\n%s", len(got), stdout)
	}
	var ids []string
	for i, want := range []float64{1, 3, 4, 5} {
		id, _ := got[i]["id"].(string)
		if got[i]["line"] != want || got[i]["state"] != "queued" || !job.ValidID(id) {
			t.Errorf("line %d of the output = %v; want line %v queued with an id", i+1, got[i], want)
		}
		ids = append(ids, id)
	}
	if ids[2] != "batch-three-0001" {
		t.Errorf("the job with an id got %s", ids[2])
	}
	stored := te.storedJobIDs(t)
	if !slices.Equal(stored, ids) {
		t.Errorf("job stream holds %v, want %v", stored, ids)
	}
	keys, err := te.st.List(t.Context(), "inputs/")
	if err != nil || len(keys) != 2 {
		t.Errorf("store holds inputs %+v (%v); want the two distinct contents once each", keys, err)
	}
	st, err := te.c.Status(t.Context(), ids[1])
	if err != nil || st.State != job.StateQueued {
		t.Errorf("status of a batch job = %+v, %v", st, err)
	}

	// The same jobs from stdin, with their ids, are dropped as duplicates where they have one.
	var out bytes.Buffer
	e := &env{getenv: te.getenv, stdin: strings.NewReader(lines[3] + "\n"), stdout: &out, stderr: &bytes.Buffer{}, publish: defaultPublishPolicy}
	if err := run(t.Context(), e, []string{"run", "--jobs", "-"}); err != nil {
		t.Fatalf("run --jobs -: %v", err)
	}
	if l := jsonLines(t, out.String()); len(l) != 1 || l[0]["id"] != "batch-three-0001" || l[0]["duplicate"] != true {
		t.Errorf("resubmitting a job with its id = %v; want it flagged as a duplicate", l)
	}
	if n := len(te.storedJobIDs(t)); n != 4 {
		t.Errorf("job stream holds %d jobs after the duplicate, want 4", n)
	}
}

func TestRunJobsErrors(t *testing.T) {
	te := newTestEnv(t)
	dir := t.TempDir()
	tests := []struct {
		name, text string
		args       []string
		want       string
	}{
		{"not json", "{\"profile\":\"p\",\"task\":\"t\"}\nnot json\n", nil, "line 2: invalid character"},
		{"unknown field", `{"profile":"p","task":"t","priority":1}`, nil, `line 1: json: unknown field "priority"`},
		{"two objects", `{"profile":"p","task":"t"} {"profile":"p","task":"t"}`, nil, "line 1: more than one JSON value"},
		{"no task", `{"profile":"p"}`, nil, "line 1: profile and task are required"},
		{"bad profile", `{"profile":"../p","task":"t"}`, nil, `line 1: invalid job: profile: "../p" is not a profile name`},
		{"bad id", `{"profile":"p","task":"t","id":"NO"}`, nil, `line 1: id "NO" is not a job id`},
		{"same id twice", "{\"profile\":\"p\",\"task\":\"t\",\"id\":\"same-id-0001\"}\n{\"profile\":\"p\",\"task\":\"t\",\"id\":\"same-id-0001\"}", nil, "line 2: id same-id-0001 is also on line 1"},
		{"missing input", `{"profile":"p","task":"t","inputs":["` + filepath.Join(dir, "none.csv") + `"]}`, nil, "line 1: run: input"},
		{"empty", "\n\n", nil, "holds no jobs"},
		{"with --profile", `{"profile":"p","task":"t"}`, []string{"--profile", "p"}, "leave out --profile"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := writeTestFile(t, dir, fmt.Sprintf("jobs%d.jsonl", i), tt.text)
			_, _, err := te.submit(t, append([]string{"run", "--jobs", file}, tt.args...)...)
			if exitCode(err) != 1 || !strings.Contains(message(err), tt.want) {
				t.Errorf("exit %d, %q; want exit 1 and %q", exitCode(err), message(err), tt.want)
			}
		})
	}
	if _, _, err := te.submit(t, "run", "--jobs", filepath.Join(dir, "absent.jsonl")); exitCode(err) != 1 || !strings.Contains(message(err), "no such file") {
		t.Errorf("run --jobs of a missing file: %v", err)
	}
	if ids := te.storedJobIDs(t); len(ids) != 0 {
		t.Errorf("a bad jobs file submitted %v", ids)
	}
}

// TestRunJobsWait: --wait follows every job with one progress display and exits with the
// worst job's code.
func TestRunJobsWait(t *testing.T) {
	te := newTestEnv(t)
	ends := map[string]job.State{"wait-ok-00000001": job.StateSucceeded, "wait-ok-00000002": job.StateSucceeded, "wait-bad-0000003": job.StateFailed}
	var lines []string
	for _, id := range []string{"wait-ok-00000001", "wait-ok-00000002", "wait-bad-0000003"} {
		lines = append(lines, fmt.Sprintf(`{"profile":"csv-analyst","task":"t","id":%q}`, id))
	}
	file := writeTestFile(t, t.TempDir(), "jobs.jsonl", strings.Join(lines, "\n"))
	// A stand-in worker: each job runs, then ends as planned.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for id, end := range ends {
			for {
				if _, err := te.c.Status(ctx, id); err == nil || ctx.Err() != nil {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			_, _ = te.q.UpdateStatus(ctx, ref(id), func(st *job.Status) { st.State, st.Attempt, st.Worker = job.StateRunning, 1, "w1" })
			_, _ = te.q.UpdateStatus(ctx, ref(id), func(st *job.Status) { st.State = end })
		}
	}()
	stdout, stderr, err := te.submit(t, "run", "--jobs", file, "--wait")
	if exitCode(err) != exitFailed {
		t.Errorf("exit %d (%v), want %d: the worst job failed\n%s", exitCode(err), err, exitFailed, stderr)
	}
	got := jsonLines(t, stdout)
	if len(got) != 6 {
		t.Fatalf("%d lines, want 3 submissions and 3 final states:\n%s", len(got), stdout)
	}
	for _, l := range got[3:] {
		if l["state"] != string(ends[l["id"].(string)]) {
			t.Errorf("final line %v; want state %s", l, ends[l["id"].(string)])
		}
	}
	if !strings.Contains(stderr, "3 jobs: 2 succeeded, 1 failed") {
		t.Errorf("the progress display does not end with the totals:\n%s", stderr)
	}
}

// TestInputsUploadedOnce: an input the store already holds is not sent again, even from
// another submission; counted by a store that records what it is sent.
func TestInputsUploadedOnce(t *testing.T) {
	te := newTestEnv(t)
	data := bytes.Repeat([]byte("0123456789abcdef"), 50<<20/16) // 50 MiB
	path := writeTestFile(t, t.TempDir(), "big.bin", string(data))
	counting := &countingStore{Store: te.st}
	for i := range 2 {
		in, err := uploadInputs(t.Context(), counting, []string{path, path})
		if err != nil {
			t.Fatal(err)
		}
		if in[path].Size != int64(len(data)) || in[path].SHA256 != hexSum(data) {
			t.Errorf("input = %+v", in[path])
		}
		want := int64(len(data))
		if i == 1 {
			want = 0
		}
		if got := counting.sent.Swap(0); got != want {
			t.Errorf("submission %d sent %d bytes to the store, want %d", i+1, got, want)
		}
	}
	if _, err := te.st.Stat(t.Context(), store.InputKey(hexSum(data))); err != nil {
		t.Errorf("the input is not in the store: %v", err)
	}
}

// TestRunJobsAckLostAcrossRestart: a line whose async publish is stored but whose ack is lost
// is published again, and the server drops that copy as a duplicate of the first: the line
// says queued, never "duplicate" (which would tell a script that someone else submitted it
// before), and the stream holds it once. run without --jobs does the same (TestRunAckLostAcrossRestart).
func TestRunJobsAckLostAcrossRestart(t *testing.T) {
	te := newTestEnv(t)
	const id = "ack-lost-00000001"
	file := writeTestFile(t, t.TempDir(), "jobs.jsonl", `{"profile":"csv-analyst","task":"t","id":"`+id+`"}`)
	r := te.submitAckLostAcrossRestart(t, "run", "--jobs", file)
	if r.err != nil {
		t.Fatalf("submit run --jobs: exit %d, %v\n%s", exitCode(r.err), r.err, r.stderr)
	}
	lines := jsonLines(t, r.stdout)
	if len(lines) != 1 || lines[0]["id"] != id || lines[0]["state"] != string(job.StateQueued) || lines[0]["duplicate"] != nil {
		t.Errorf("lines %v; want the one job queued, not a duplicate: its own first copy was", lines)
	}
	waitFor(t, "the test's connection after the restart", func() bool {
		_, err := te.js.Stream(t.Context(), "BOXCAR_JOBS_default")
		return err == nil
	})
	if ids := te.storedJobIDs(t); len(ids) != 1 || ids[0] != id {
		t.Errorf("job stream holds %v; want %s once", ids, id)
	}
}

// interruptOnWrite is stdout that interrupts the command (as Ctrl-C does) on its first line.
// Not an embedded Buffer: its WriteString would go around Write.
type interruptOnWrite struct {
	out       bytes.Buffer
	interrupt context.CancelFunc
}

func (w *interruptOnWrite) Write(p []byte) (int, error) {
	w.interrupt()
	return w.out.Write(p)
}

// TestRunJobsInterrupted: Ctrl-C while a jobs file is being published still gives every line
// its output line, in file order: queued (confirmed), unknown (sent, not confirmed) or error
// (never sent), a job on the stream never said to be "error"; and the command exits 130, not 0.
func TestRunJobsInterrupted(t *testing.T) {
	te := newTestEnv(t)
	const n = 3 * maxInFlight // more than are ever in flight: some are never sent
	var lines []string
	for range n {
		lines = append(lines, `{"profile":"csv-analyst","task":"t"}`)
	}
	file := writeTestFile(t, t.TempDir(), "jobs.jsonl", strings.Join(lines, "\n"))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	stdout := &interruptOnWrite{interrupt: cancel}
	var stderr bytes.Buffer
	err := Run(ctx, []string{"run", "--jobs", file}, te.getenv, stdout, &stderr)
	if exitCode(err) != exitInterrupted {
		t.Errorf("exit %d (%v), want %d for an interrupted run", exitCode(err), err, exitInterrupted)
	}
	stored := map[string]bool{}
	for _, id := range te.storedJobIDs(t) {
		stored[id] = true
	}
	got := jsonLines(t, stdout.out.String())
	if len(got) != n {
		t.Fatalf("%d output lines for %d lines of the file", len(got), n)
	}
	states := map[string]int{}
	for i, l := range got {
		state, _ := l["state"].(string)
		states[state]++
		switch {
		case l["line"] != float64(i+1):
			t.Fatalf("output line %d is for line %v: not in file order", i+1, l["line"])
		case state == "error" && stored[l["id"].(string)]:
			t.Errorf("line %v says error (not submitted), yet the job is on the stream", l)
		case state == string(job.StateQueued) && !stored[l["id"].(string)]:
			t.Errorf("line %v says queued, yet the job is not on the stream", l)
		case state != "error" && state != "unknown" && state != string(job.StateQueued):
			t.Errorf("line %v: state %q", l, state)
		}
	}
	if states["error"] == 0 {
		t.Errorf("states %v: every line was sent, so nothing was interrupted; raise n", states)
	}

	// Interrupted as the last line is confirmed: every line queued, and still not exit 0.
	one := writeTestFile(t, t.TempDir(), "one.jsonl", lines[0])
	ctx, cancel = context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	stdout = &interruptOnWrite{interrupt: cancel}
	err = Run(ctx, []string{"run", "--jobs", one}, te.getenv, stdout, &stderr)
	if l := jsonLines(t, stdout.out.String()); len(l) != 1 || l[0]["state"] != string(job.StateQueued) || exitCode(err) != exitInterrupted {
		t.Errorf("exit %d (%v), lines %v; want the line queued and exit %d", exitCode(err), err, l, exitInterrupted)
	}
}

// TestInputOfAnotherSizeIsReplaced: an object under an input's digest key that is not its size
// (cut short by a tool that copied the store, or put there by another writer of the tenant's
// folder) is replaced with the input's bytes. Submit took it for the input: the job was queued
// and failed at the worker as input_digest_mismatch, and every submission again the same.
func TestInputOfAnotherSizeIsReplaced(t *testing.T) {
	te := newTestEnv(t)
	data := "region,total\nnorth,3\n"
	path := writeTestFile(t, t.TempDir(), "sales.csv", data)
	key := store.InputKey(hexSum([]byte(data)))
	if err := te.st.Put(t.Context(), key, strings.NewReader("region,to"), 9); err != nil {
		t.Fatal(err)
	}
	if _, err := uploadInputs(t.Context(), te.st, []string{path}); err != nil {
		t.Fatal(err)
	}
	rc, err := te.st.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if got, _ := io.ReadAll(rc); string(got) != data {
		t.Errorf("the store holds %q under the input's key, want %q", got, data)
	}
}
