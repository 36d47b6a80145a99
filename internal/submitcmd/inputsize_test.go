package submitcmd

import (
	"context"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// advertiseLimit publishes the example profiles as worker does, csv-analyst taking at most
// maxInput bytes of inputs, until the test ends.
func (te *testEnv) advertiseLimit(t *testing.T, worker string, maxInput int64) {
	t.Helper()
	cfg, err := config.Parse(examples.Config)
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Profiles["csv-analyst"]
	p.Limits.MaxInputBytes = maxInput
	cfg.Profiles["csv-analyst"] = p
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = te.q.AdvertiseProfiles(ctx, worker, cfg.Profiles, cfg.TenantsOrDefault())
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the profiles of "+worker, func() bool {
		entries, err := te.c.LiveProfiles(t.Context())
		return err == nil && strings.Contains(strings.Join(workersOf(entries), " "), worker)
	})
}

// workersOf are the workers of the entries.
func workersOf(entries []queue.WorkerProfiles) []string {
	var out []string
	for _, e := range entries {
		out = append(out, e.Worker)
	}
	return out
}

// TestInputsOverTheProfilesLimit: a job whose inputs are more bytes together than any live
// worker's profile takes (max_input_bytes) is refused before anything is uploaded or queued,
// naming the limit; the workers would fail it as input_too_large after the upload.
func TestInputsOverTheProfilesLimit(t *testing.T) {
	te := newTestEnv(t)
	te.advertiseLimit(t, "worker-small", 10)
	dir := t.TempDir()
	six := writeTestFile(t, dir, "six.csv", "a,b,c\n")
	otherSix := writeTestFile(t, dir, "other.csv", "d,e,f\n")
	eleven := writeTestFile(t, dir, "eleven.csv", "a,b,c\n1,2,\n")
	jobs := func(lines ...string) string {
		return writeTestFile(t, t.TempDir(), "jobs.jsonl", strings.Join(lines, "\n")+"\n")
	}
	tests := []struct {
		name string
		args []string
		want string // in the error; "" for a job submitted
	}{
		{"one input over", []string{"run", "--profile", "csv-analyst", "--task", "t", "--input", eleven}, "inputs are 11 bytes together, over max_input_bytes 10 of profile csv-analyst"},
		{"two inputs over together", []string{"run", "--profile", "csv-analyst", "--task", "t", "--input", six, "--input", otherSix}, "inputs are 12 bytes together"},
		{"a line of a batch over", []string{"run", "--jobs", jobs(`{"profile":"csv-analyst","task":"a","inputs":["`+six+`"]}`, `{"profile":"csv-analyst","task":"b","inputs":["`+eleven+`"]}`)}, "line 2: the inputs are 11 bytes together"},
		{"within", []string{"run", "--profile", "csv-analyst", "--task", "t", "--input", six}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := te.jobMessages(t)
			_, stderr, err := te.submit(t, append(tt.args, "-o", "json")...)
			if tt.want == "" {
				if err != nil || te.jobMessages(t) != before+1 {
					t.Fatalf("%v\n%s; want it submitted", err, stderr)
				}
				return
			}
			e := jsonError(t, stderr)
			if exitCode(err) != exitRejected || e.Code != codeInputTooLarge || !strings.Contains(e.Message, tt.want) || !strings.Contains(e.Message, "nothing was uploaded or submitted") {
				t.Errorf("exit %d, %+v; want exit 4, code %s and %q", exitCode(err), e, codeInputTooLarge, tt.want)
			}
			if te.jobMessages(t) != before {
				t.Error("a job was queued")
			}
		})
	}
	if keys := listKeys(t, te.st, "inputs/"); len(keys) != 1 {
		t.Errorf("inputs in the store: %v; want only the one of the job within the limit", keys)
	}
	// A second worker whose profile takes more: the job goes to it (a worker hands a job its
	// profile cannot take to a peer whose can).
	te.advertiseLimit(t, "worker-large", 100)
	if _, stderr, err := te.submit(t, "run", "--profile", "csv-analyst", "--task", "t", "--input", eleven); err != nil {
		t.Errorf("a job a live worker can take: %v\n%s", err, stderr)
	}
}
