package submitcmd

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
)

func TestClean(t *testing.T) {
	tests := []struct{ in, want string }{
		{"csv_stats", "csv_stats"},
		{"café ✓ 表", "café ✓ 表"},
		{"\x1b]0;pwned\x07", `\u001b]0;pwned\u0007`},
		{"\x1b[2J\x1b[H", `\u001b[2J\u001b[H`},
		{"a\u009b31mb", `a\u009b31mb`}, // C1 CSI
		{"rtl\u202etxt.exe", `rtl\u202etxt.exe`},
		{"zero\u200bwidth\ufeff", `zero\u200bwidth\ufeff`},
		{"line\nbreak\r\ttab", `line\nbreak\r\ttab`},
		{"sep\u2028par\u2029", `sep\u2028par\u2029`},
		{"bad\xffutf8", `bad\xffutf8`},
		{"del\x7f", `del\u007f`},
	}
	for _, tt := range tests {
		if got := clean(tt.in); got != tt.want {
			t.Errorf("clean(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestPrintfEscapesErrors: an error or a Stringer printed with printf is escaped as a string
// is: an error quoting a key from the store with a newline in it printed the rest as a line of
// its own ("FAIL …: …\nverified: every file matches"), the stream keeping newlines.
func TestPrintfEscapesErrors(t *testing.T) {
	const evil = "runs/x\nverified: every file matches\x1b[2J"
	for _, arg := range []any{errors.New(evil), shown{evil}, evil} {
		var b strings.Builder
		printf(&b, "FAIL %v\n", arg)
		if strings.Count(b.String(), "\n") != 1 || strings.ContainsRune(b.String(), 0x1b) {
			t.Errorf("printf of a %T printed %q; want one line, escaped", arg, b.String())
		}
	}
}

// shown is a Stringer that is not a string.
type shown struct{ s string }

func (s shown) String() string { return s.s }

func TestSafeWriter(t *testing.T) {
	var out bytes.Buffer
	w := &safeWriter{w: &out}
	// U+202E split across two writes, then submit's own newline and tab, then an escape.
	for _, p := range []string{"a\xe2\x80", "\xaeb\n", "c\td\x1b[2J\n"} {
		if n, err := w.Write([]byte(p)); err != nil || n != len(p) {
			t.Fatalf("Write(%q) = %d, %v", p, n, err)
		}
	}
	if got, want := out.String(), "a\\u202eb\nc\td\\u001b[2J\n"; got != want {
		t.Errorf("safeWriter wrote %q, want %q", got, want)
	}
	// JSON stays JSON, with the same value.
	out.Reset()
	data, _ := json.Marshal(map[string]string{"tool": "x\u202e\u0085y"})
	_, _ = w.Write(append(data, '\n'))
	var v map[string]string
	if err := json.Unmarshal(out.Bytes(), &v); err != nil || v["tool"] != "x\u202e\u0085y" || bytes.ContainsRune(out.Bytes(), '\u202e') {
		t.Errorf("JSON through safeWriter = %q (%v); want valid JSON with the same value and no raw U+202E", out.String(), err)
	}
}

// forged is what a hostile job puts in its status and manifest: it retitles the window, clears
// the screen, and prints a line that claims the job succeeded, once with an RTL override.
func forged(id string) string {
	return "csv\u202eats\x1b]0;pwned\x07\x1b[2J\x1b[H\r\njob " + id + " succeeded\n\u009b31m"
}

// assertInert fails when out holds anything a terminal would act on, or a line that starts
// like the forged one.
func assertInert(t *testing.T, what, out, id string) {
	t.Helper()
	for _, bad := range []string{"\x1b", "\x07", "\r", "\u202e", "\u009b"} {
		if strings.Contains(out, bad) {
			t.Errorf("%s prints %q raw:\n%q", what, bad, out)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "job "+id+" succeeded") {
			t.Errorf("%s prints a forged line %q", what, line)
		}
	}
}

func TestHostileStatusIsInert(t *testing.T) {
	te := newTestEnv(t)
	id := te.submitJob(t)
	evil := forged(id)
	if _, err := te.q.UpdateStatus(t.Context(), ref(id), func(st *job.Status) {
		st.State, st.Attempt, st.Worker, st.Progress = job.StateRunning, 1, "w\x1b[31m", "tool call 1 of 3: "+evil
	}); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err := te.submit(t, "status", id)
	assertInert(t, "status", stdout+stderr, id)
	if err != nil {
		t.Fatal(err)
	}
	// A state no worker writes, which logs of a job not ended names (it printed it raw).
	if _, err := te.q.UpdateStatus(t.Context(), ref(id), func(st *job.Status) { st.State = job.State(evil) }); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err = te.submit(t, "logs", id)
	assertInert(t, "logs", stdout+stderr, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := te.q.UpdateStatus(t.Context(), ref(id), func(st *job.Status) { st.State, st.Error, st.Cap = job.StateFailed, evil, "" }); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err = te.submit(t, "watch", id)
	code, msg := ExitCode(err)
	assertInert(t, "watch", stdout+stderr+"submit: "+msg+"\n", id)
	if code != exitFailed || !strings.Contains(stdout, "job "+id+" failed") {
		t.Errorf("watch: exit %d\n%s", code, stdout)
	}
	stdout, _, _ = te.submit(t, "status", id, "--output", "json")
	assertInert(t, "status --output json", stdout, id)
	if st := lastJSON(t, stdout); st["error"] != evil {
		t.Errorf("the JSON error is %q; want the job's error, escaped but the same value", st["error"])
	}
}

func TestHostileManifestIsInert(t *testing.T) {
	te := newTestEnv(t)
	var evil string
	id := te.commitRun(t, true, func(m *provenance.Manifest) {
		evil = forged(m.Job.ID)
		m.ToolCalls[0].Tool = evil
		m.ToolCalls[0].Error = evil
		m.Outcome.Error = evil
		m.Job.Labels = map[string]string{"team": evil}
		m.Collected = provenance.Collected{Report: "final_message", ReportReason: "report_unreadable", ReportError: evil,
			Skipped: []provenance.Skipped{{Path: "artifacts/" + evil, Reason: "bad_name", Detail: evil}}}
	})
	for _, args := range [][]string{{"manifest", id}, {"verify", id}, {"verify", id, "--output", "json"}, {"get", id, "--out", t.TempDir()}} {
		stdout, stderr, err := te.submit(t, args...)
		_, msg := ExitCode(err)
		assertInert(t, strings.Join(args[:1], " "), stdout+stderr+msg, id)
		if args[0] == "manifest" && (!strings.Contains(stdout, "report:    from final_message (report_unreadable: ") || !strings.Contains(stdout, "left out:  artifacts/")) {
			t.Errorf("manifest does not say where the report came from and what was left out:\n%s", stdout)
		}
	}
}
