package submitcmd

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/store"
)

func TestGCFileStore(t *testing.T) {
	te := newTestEnv(t)
	testGC(t, te, nil, func(t *testing.T, key string, at time.Time) {
		if err := os.Chtimes(filepath.Join(te.storeDir, "tenants", "default", filepath.FromSlash(key)), at, at); err != nil {
			t.Fatal(err)
		}
	})
}

// testGC runs gc on te.st, reached with the flags storeArgs (none: BOXCAR_HOME's file store),
// over the jobs a store holds in every state: it lists exactly the folders of ended jobs that
// the manifest does not name and that are older than the grace, deletes only those, and the
// committed run still verifies. touch sets an object's modification time, as the backend
// keeps it, to make it old.
func testGC(t *testing.T, te *testEnv, storeArgs []string, touch func(t *testing.T, key string, at time.Time)) {
	ctx := t.Context()
	old := time.Now().Add(-48 * time.Hour)
	put := func(folder, name string) {
		t.Helper()
		if err := te.st.PutIfAbsent(ctx, folder+name, strings.NewReader(name), int64(len(name))); err != nil {
			t.Fatal(err)
		}
	}
	age := func(prefix string) {
		t.Helper()
		objects, err := te.st.List(ctx, prefix)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objects {
			touch(t, o.Key, old)
		}
	}
	status := func(id string, change func(*job.Status)) {
		t.Helper()
		if _, err := te.q.UpdateStatus(ctx, ref(id), change); err != nil {
			t.Fatal(err)
		}
	}

	// A committed job, its run two days old, with the folder of an attempt that crashed
	// mid-upload and the folder of a stale attempt that wrote a moment ago.
	committed := te.commitRun(t, true)
	crashed := store.AttemptPrefix(committed, "2-deadbeef")
	put(crashed, "report.md")
	put(crashed, "artifacts/table.csv")
	age(store.RunPrefix(committed))
	stale := store.AttemptPrefix(committed, "3-0badf00d")
	put(stale, "transcript.jsonl")
	// A committed job whose job_timeout is longer than the grace: its old folder stays.
	slow := te.commitRun(t, false, func(m *provenance.Manifest) { m.Limits.JobTimeout = config.Duration(72 * time.Hour) })
	slowCrashed := store.AttemptPrefix(slow, "2-5105105e")
	put(slowCrashed, "report.md")
	age(store.RunPrefix(slow))
	// A job whose manifest is a run of another tenant's, copied there: it tells nothing of
	// which folder of this job's is the run's, so none is removed.
	foreign := te.commitRun(t, true, func(m *provenance.Manifest) { m.Tenant = provenance.Tenant{Name: "alpha"} })
	foreignCrashed := store.AttemptPrefix(foreign, "2-a1fa0000")
	put(foreignCrashed, "report.md")
	age(store.RunPrefix(foreign))
	// A running job with the old folder of an earlier attempt.
	running := job.NewID()
	status(running, func(s *job.Status) { s.State, s.Attempt = job.StateRunning, 2 })
	runningFolder := store.AttemptPrefix(running, "1-12345678")
	put(runningFolder, "report.md")
	age(store.RunPrefix(running))
	// A job that ended dead without a manifest two days ago, and one that did a minute ago.
	dead := job.NewID()
	status(dead, func(s *job.Status) { s.State, s.FinishedAt = job.StateDead, old })
	deadFolder := store.AttemptPrefix(dead, "5-87654321")
	put(deadFolder, "transcript.jsonl")
	age(store.RunPrefix(dead))
	justDead := job.NewID()
	status(justDead, func(s *job.Status) { s.State, s.FinishedAt = job.StateDead, time.Now().Add(-time.Minute) })
	justDeadFolder := store.AttemptPrefix(justDead, "5-abcdef01")
	put(justDeadFolder, "transcript.jsonl")
	age(store.RunPrefix(justDead))
	// A folder nothing tells about: no manifest, no status.
	unknown := job.NewID()
	unknownFolder := store.AttemptPrefix(unknown, "1-00000000")
	put(unknownFolder, "report.md")
	age(store.RunPrefix(unknown))

	before := listKeys(t, te.st, "runs/")
	gc := func(args ...string) (gcOutput, string) {
		t.Helper()
		stdout, stderr, err := te.submit(t, append(append([]string{"gc"}, storeArgs...), args...)...)
		if err != nil {
			t.Fatalf("gc %s: %v\n%s%s", strings.Join(args, " "), err, stdout, stderr)
		}
		var out gcOutput
		if slices.Contains(args, "json") {
			if err := json.Unmarshal([]byte(stdout), &out); err != nil {
				t.Fatalf("gc --output json: %v\n%s", err, stdout)
			}
		}
		return out, stdout
	}
	actions := func(out gcOutput) map[string]string {
		got := map[string]string{}
		for _, f := range out.Folders {
			got[f.Folder] = f.Action
		}
		return got
	}
	kept := map[string]string{stale: gcKept, slowCrashed: gcKept, foreignCrashed: gcKept, store.AttemptPrefix(foreign, testAttempt): gcKept,
		runningFolder: gcKept, justDeadFolder: gcKept, unknownFolder: gcKept}
	want := func(action string) map[string]string {
		m := map[string]string{crashed: action, deadFolder: action}
		maps.Copy(m, kept)
		return m
	}

	// The dry run lists and deletes nothing; the committed attempt's folder is not even listed.
	out, _ := gc("--output", "json")
	if got := actions(out); !maps.Equal(got, want(gcWouldDelete)) {
		t.Errorf("gc lists %v, want %v", got, want(gcWouldDelete))
	}
	if n := len("report.md") + len("artifacts/table.csv") + len("transcript.jsonl"); out.Objects != 3 || out.Bytes != int64(n) || out.Delete {
		t.Errorf("gc counts %d objects, %d bytes, delete %v; want 3 objects, %d bytes, no delete", out.Objects, out.Bytes, out.Delete, n)
	}
	for _, f := range out.Folders {
		if f.Folder == crashed && (f.Objects != 2 || !f.Written.Before(time.Now().Add(-47*time.Hour)) || !strings.Contains(f.Reason, "not named by the committed manifest (job succeeded, attempt 1)")) {
			t.Errorf("gc says of the crashed attempt %+v", f)
		}
	}
	if after := listKeys(t, te.st, "runs/"); !slices.Equal(after, before) {
		t.Errorf("the dry run changed the store: %v, was %v", after, before)
	}
	_, text := gc()
	for _, w := range []string{"would delete  " + crashed + "  2 objects, 28 B, written ", "kept          " + runningFolder, "its status is running", "within the grace of 24h0m0s", "within the grace of 72h1m0s", "no manifest and no status", "give --delete to delete them"} {
		if !strings.Contains(text, w) {
			t.Errorf("gc output lacks %q:\n%s", w, text)
		}
	}

	out, _ = gc("--delete", "--output", "json")
	if got := actions(out); !maps.Equal(got, want(gcDeleted)) {
		t.Errorf("gc --delete did %v, want %v", got, want(gcDeleted))
	}
	var left []string
	for _, k := range before {
		if !strings.HasPrefix(k, crashed) && !strings.HasPrefix(k, deadFolder) {
			left = append(left, k)
		}
	}
	if after := listKeys(t, te.st, "runs/"); !slices.Equal(after, left) {
		t.Errorf("after gc --delete the store holds %v, want %v", after, left)
	}
	if stdout, _, err := te.submit(t, append(append([]string{"verify", committed}, storeArgs...), "--require-signature")...); err != nil {
		t.Errorf("verify after gc --delete: %v\n%s", err, stdout)
	}
	if _, text = gc("--delete"); !strings.Contains(text, "nothing to delete in "+te.st.URL("")+" (7 unnamed attempt folders kept)") {
		t.Errorf("a second gc --delete:\n%s", text)
	}

	// A grace no longer than the workers' ack_wait could take a live attempt's folder.
	if _, _, err := te.submit(t, append(append([]string{"gc"}, storeArgs...), "--older-than", "1m")...); exitCode(err) != 1 || !strings.Contains(message(err), "is not longer than the workers' ack_wait (1m0s)") {
		t.Errorf("gc --older-than 1m: %v", err)
	}
}

func listKeys(t *testing.T, st store.Store, prefix string) []string {
	t.Helper()
	objects, err := st.List(t.Context(), prefix)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, o := range objects {
		keys = append(keys, o.Key)
	}
	return keys
}

// TestGCLeavesClocksBehindItsOwnTheirGrace: gc judges ages on its own clock, but the times it
// judges are the store's (when a folder was written) and a worker's (when a job ended). With
// both 5 minutes behind gc's, a job that died a moment ago, whose last attempt wrote its
// folder a moment ago, looks 5 minutes old: a grace of 3 minutes still keeps its folder.
func TestGCLeavesClocksBehindItsOwnTheirGrace(t *testing.T) {
	te := newTestEnv(t)
	ctx := t.Context()
	behind := time.Now().Add(-5 * time.Minute)
	id := job.NewID()
	if _, err := te.q.UpdateStatus(ctx, ref(id), func(s *job.Status) { s.State, s.FinishedAt = job.StateDead, behind }); err != nil {
		t.Fatal(err)
	}
	folder := store.AttemptPrefix(id, "5-abcdef01")
	key := folder + "transcript.jsonl"
	if err := te.st.PutIfAbsent(ctx, key, strings.NewReader("{}\n"), 3); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(filepath.Join(te.storeDir, "tenants", "default", filepath.FromSlash(key)), behind, behind); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err := te.submit(t, "gc", "--older-than", "3m", "--delete", "--output", "json")
	if err != nil {
		t.Fatalf("gc: %v\n%s%s", err, stdout, stderr)
	}
	var out gcOutput
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("gc --output json: %v\n%s", err, stdout)
	}
	if len(out.Folders) != 1 || out.Folders[0].Action != gcKept {
		t.Errorf("gc: %+v, want the folder of the job that just died kept", out.Folders)
	}
	if keys := listKeys(t, te.st, store.RunPrefix(id)); !slices.Equal(keys, []string{key}) {
		t.Errorf("after gc --delete the run holds %v, want %v", keys, key)
	}
}
