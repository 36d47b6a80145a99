package submitcmd

import (
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/store"
)

// TestReadersOfARunNotCommittedYet: verify, get and manifest of a job whose run is not
// committed (queued, or running with an attempt's objects uploaded and no manifest yet) say
// it has no committed run yet and how to follow it, exit 1 with code not_committed, and say
// nothing of a failed verification. verify exited 8 (verification_failed) as for a tampered
// run, and printed NOT VERIFIED.
func TestReadersOfARunNotCommittedYet(t *testing.T) {
	te := newTestEnv(t)
	queued := te.submitJob(t)
	running := te.submitJob(t)
	te.setState(t, running, func(s *job.Status) { s.State, s.Attempt = job.StateRunning, 1 })
	if err := te.st.Put(t.Context(), store.AttemptPrefix(running, testAttempt)+"report.md", strings.NewReader("half"), -1); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{queued, running} {
		for _, cmd := range [][]string{{"verify", id}, {"get", id, "--out", t.TempDir()}, {"manifest", id}} {
			name := cmd[0] + " of " + map[bool]string{true: "a queued job", false: "a running job"}[id == queued]
			t.Run(name, func(t *testing.T) {
				stdout, stderr, err := te.submit(t, cmd...)
				msg := message(err)
				if exitCode(err) != 1 || !strings.Contains(msg, "has no committed run yet") || !strings.Contains(msg, "submit watch "+id) {
					t.Errorf("%s: exit %d, %q; want 1 saying it has no committed run yet and how to follow it", name, exitCode(err), msg)
				}
				if said := strings.ToLower(stdout + stderr + msg); strings.Contains(said, "verif") && !strings.Contains(said, "nothing to verify") {
					t.Errorf("%s speaks of verification:\n%s%s%s", name, stdout, stderr, msg)
				}
				_, stderr, err = te.submit(t, append(cmd, "--output", "json")...)
				if e := jsonError(t, stderr); e.Code != codeNotCommitted || e.ExitCode != 1 || exitCode(err) != 1 {
					t.Errorf("%s --output json: %+v; want code %s, exit 1", name, e, codeNotCommitted)
				}
			})
		}
	}
}
