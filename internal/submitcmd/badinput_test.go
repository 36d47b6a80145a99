package submitcmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBadInputIsUsage: a job id that is not one, a missing required flag and a bad flag value
// are bad usage in every command (exit 1, code usage with --output json), said before NATS,
// the store or a key is read, in words that name what was given and what to give. Before, status,
// watch, logs and cancel asked NATS about an id that cannot be one (and, NATS away, said only
// that it was unreachable); verify and manifest of one said "give one JOB_ID" as though none
// was given; and these, run's missing --profile, a bad --id or --label, and get's missing
// --out had code error. run checked the job itself (its profile's name, its label keys, an id
// kept for rejected messages) only after it had asked NATS and uploaded the inputs, and a
// profile name no job can give was an unknown profile (exit 4).
func TestBadInputIsUsage(t *testing.T) {
	t.Parallel()
	const notID = `"../x" is not a job id`
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"status", "../x"}, "status: " + notID},
		{[]string{"watch", "../x"}, "watch: " + notID},
		{[]string{"logs", "../x"}, "logs: " + notID},
		{[]string{"cancel", "../x"}, "cancel: " + notID},
		{[]string{"manifest", "../x"}, "manifest: " + notID},
		{[]string{"verify", "../x"}, "verify: " + notID},
		{[]string{"get", "../x", "--out", "OUT"}, "get: " + notID},
		{[]string{"approvals", "../x"}, "approvals: " + notID},
		{[]string{"approve", "../x", "call_1", "--yes"}, "approve: " + notID},
		{[]string{"deny", "../x", "call_1", "--yes"}, "deny: " + notID},
		{[]string{"get", "20261202t101500-abcdef012345"}, "get: give one JOB_ID and --out DIR"},
		{[]string{"run", "--task", "t"}, "run: --profile and --task are required"},
		{[]string{"run", "--profile", "p", "--task", "t", "--id", "AB"}, `run: --id "AB" is not a job id`},
		{[]string{"run", "--profile", "p", "--task", "t", "--label", "nolabel"}, `run: --label "nolabel": use key=value`},
		{[]string{"run", "--jobs", "-", "--profile", "p"}, "run: --jobs takes every job from the file"},
		{[]string{"completion", "tcsh"}, `completion: "tcsh" is not a shell this supports`},
		{[]string{"run", "--profile", "p", "--task", "t", "--input", "IN1", "--input", "IN2"}, `run: invalid job: inputs[1].name: "a.csv" appears twice`},
		{[]string{"run", "--profile", "Bad Name", "--task", "t"}, `run: invalid job: profile: "Bad Name" is not a profile name`},
		{[]string{"run", "--profile", "p", "--task", "t", "--label", "bad key=v"}, `run: invalid job: labels: key "bad key" is not a label key`},
		{[]string{"run", "--profile", "p", "--task", "t", "--id", "stream-seq-00000001"}, `run: invalid job: id: "stream-seq-00000001" begins with "stream-seq-"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			args := append([]string{}, tt.args...)
			for i, a := range args {
				switch a {
				case "OUT":
					args[i] = t.TempDir()
				case "IN1", "IN2": // two files of one name, in two folders
					args[i] = filepath.Join(t.TempDir(), "a.csv")
					if err := os.WriteFile(args[i], []byte("x\n"), 0o600); err != nil {
						t.Fatal(err)
					}
				}
			}
			_, _, err := noEnv(t, args...)
			if ErrorCode(err) != codeUsage || exitCode(err) != 1 || !strings.Contains(message(err), tt.want) {
				t.Errorf("submit %s: code %s, exit %d, %q; want code usage, exit 1, saying %q", strings.Join(tt.args, " "), ErrorCode(err), exitCode(err), message(err), tt.want)
			}
			if strings.Contains(message(err), "NATS") || strings.Contains(message(err), "key file") {
				t.Errorf("submit %s went on before it looked at its arguments: %s", strings.Join(tt.args, " "), message(err))
			}
		})
	}
}
