package submitcmd

import (
	"bytes"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/job"
)

// TestEveryCommandSaysAJobIsUnknown: status, logs and approvals of a job id that neither the
// status bucket nor the job stream knows (a typo, another NATS server, another tenant) exit 1
// with code unknown_job and say where submit looked, as watch does. approvals JOB_ID said "no
// commands are waiting for approval" and exited 0, and status and logs said only "unknown job".
func TestEveryCommandSaysAJobIsUnknown(t *testing.T) {
	te := newTestEnv(t)
	const id = "0123456789abcdef"
	for _, cmd := range [][]string{{"status", id}, {"logs", id}, {"approvals", id}, {"watch", id}, {"cancel", id}} {
		t.Run(cmd[0], func(t *testing.T) {
			stdout, stderr, err := te.submit(t, cmd...)
			msg := message(err)
			if exitCode(err) != 1 || !strings.Contains(msg, "unknown job: "+id) || !strings.Contains(msg, "as tenant default?") || stdout != "" {
				t.Errorf("%s: exit %d, %q, stdout %q, stderr %q; want exit 1, unknown job, saying where it looked", cmd[0], exitCode(err), msg, stdout, stderr)
			}
			_, stderr, err = te.submit(t, append(cmd, "--output", "json")...)
			if e := jsonError(t, stderr); e.Code != codeUnknownJob || exitCode(err) != 1 {
				t.Errorf("%s --output json: %+v; want code %s, exit 1", cmd[0], e, codeUnknownJob)
			}
		})
	}
}

// TestLogsOfAJobThatEndedWithoutARun: logs of a job that ended with no run (cancelled while
// queued, rejected before it ran) shows its steps and says it kept no run, exit 0, as logs of a
// job still running does. It exited 1 saying the job was "queued or running" and that `submit
// watch` would follow it until it ends.
func TestLogsOfAJobThatEndedWithoutARun(t *testing.T) {
	te := newTestEnv(t)
	for _, state := range []job.State{job.StateCancelled, job.StateRejected} {
		t.Run(string(state), func(t *testing.T) {
			id := te.submitJob(t)
			te.setState(t, id, func(s *job.Status) { s.State, s.Error = state, "ended before it ran" })
			stdout, stderr, err := te.submit(t, "logs", id)
			if err != nil || !strings.Contains(stdout, string(state)) || !strings.Contains(stderr, "kept no run") || strings.Contains(stderr+message(err), "queued or running") {
				t.Errorf("logs: exit %d (%v), stdout %q, stderr %q; want exit 0, the step shown, and that it kept no run", exitCode(err), err, stdout, stderr)
			}
		})
	}
}

// TestTenantThatIsNoTenantName: a --tenant or BOXCAR_TENANT that is no tenant name is bad usage
// (exit 1, naming where it came from) for every command, before NATS or the store is asked.
// Commands that read NATS waited 30 s for it as for an outage ("waiting for NATS JetStream"),
// run its whole --timeout, and those that read the store alone read under tenants/Team B/.
func TestTenantThatIsNoTenantName(t *testing.T) {
	te := newTestEnv(t)
	id := te.commitSucceeded(t)
	input := writeTestFile(t, t.TempDir(), "sales.csv", "region,total\nnorth,3\n")
	commands := [][]string{
		{"status", id}, {"logs", id}, {"approvals"}, {"list"}, {"manifest", id}, {"verify", id},
		{"get", id, "--out", t.TempDir()}, {"run", "--profile", "csv-analyst", "--task", "t", "--input", input},
	}
	for _, from := range []string{"--tenant", "BOXCAR_TENANT"} {
		for _, cmd := range commands {
			t.Run(from+" "+cmd[0], func(t *testing.T) {
				var stdout, stderr bytes.Buffer
				getenv := te.getenv
				if from == "--tenant" {
					cmd = append(cmd, "--tenant", "Team B")
				} else {
					getenv = func(k string) string {
						return map[string]string{"NATS_URL": te.natsURL, "BOXCAR_HOME": te.home, "BOXCAR_TENANT": "Team B"}[k]
					}
				}
				err := Run(t.Context(), cmd, getenv, &stdout, &stderr)
				if msg := message(err); exitCode(err) != 1 || !strings.Contains(msg, from+` "Team B" is not a tenant name`) || stderr.Len() > 0 {
					t.Errorf("%s: exit %d, %q, stderr %q; want exit 1 at once, naming %s", cmd[0], exitCode(err), msg, stderr.String(), from)
				}
			})
		}
	}
}
