package tunnel_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/sandbox/tunnel"
)

// TestCommandsExec: the session's own start of a command (Exec) does what the backend's exec
// script (podscripts/exec.sh, run by the same session through sh) does, case for case: the
// same exit code, stdout and stderr (for a program that is not there or cannot run, the same
// code and some word on stderr), and nothing of the command left running. The native runs
// carry the argv `false`, so a pod's side that ran the argv instead would answer exit code 1.
func TestCommandsExec(t *testing.T) {
	var script []byte
	for _, f := range []string{"../podscripts/killfunc.sh", "../podscripts/exec.sh"} {
		b, err := os.ReadFile(f)
		must(t, err)
		script = append(script, b...)
	}
	c := commandSession(t)
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "noexec"), []byte("#!/bin/sh\necho no\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "prog"), []byte("#!/bin/sh\necho prog \"$@\"\n"), 0o755))
	env := []string{"HOME=" + dir, "JOB=j1", "PATH=/usr/local/bin:/usr/bin:/bin"}
	for _, tt := range []struct {
		name    string
		argv    []string
		dir     string
		stdin   string
		timeout time.Duration
		code    int
		vague   bool // the programs' own words for a failure to start differ
		// wrapper is what the script's own shell adds to stderr ("Killed" for a command
		// killed by a signal), which the session's start does not.
		wrapper string
	}{
		{name: "environment", argv: []string{"sh", "-c", "env | grep -v '^_=' | sort"}},
		{name: "stdin", argv: []string{"cat"}, stdin: "in\n"},
		{name: "folder", argv: []string{"pwd"}},
		{name: "streams apart and the code", argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, code: 3},
		{name: "killed", argv: []string{"sh", "-c", "kill -9 $$"}, code: 137, wrapper: "Killed\n"},
		{name: "timeout", argv: []string{"sleep", "30"}, timeout: 200 * time.Millisecond, code: 137, wrapper: "Killed\n"},
		{name: "relative program", argv: []string{"./prog", "a"}},
		{name: "no folder", argv: []string{"true"}, dir: "missing", code: 125},
		{name: "no program", argv: []string{"boxcar-no-such-command"}, code: 127, vague: true},
		{name: "no absolute program", argv: []string{"/nonexistent/cmd"}, code: 127, vague: true},
		{name: "not executable", argv: []string{"./noexec"}, code: 126, vague: true},
		{name: "a child holds the output", argv: []string{"sh", "-c", "(sleep 30; echo late) & echo early"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			run := func(native bool) (int, string, string) {
				nonce := "n" + strconv.FormatInt(time.Now().UnixNano(), 16)
				d := filepath.Join(dir, tt.dir)
				argv := []string{"sh", "-c", string(script), "boxcar-exec", strconv.FormatFloat(tt.timeout.Seconds(), 'f', 3, 64), nonce, d}
				if tt.timeout == 0 {
					argv[4] = "0"
				}
				cmd := tunnel.Command{Argv: append(append(argv, env...), tt.argv...), Mark: "BOXCAR_EXEC=" + nonce}
				if native {
					cmd.Argv = []string{"false"}
					cmd.Exec = &tunnel.Exec{Argv: tt.argv, Dir: d, Env: env, Timeout: tt.timeout, Nonce: nonce}
				}
				var stdout, stderr bytes.Buffer
				cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(tt.stdin), &stdout, &stderr
				code, err := c.Run(t.Context(), cmd)
				if err != nil {
					t.Fatal(err)
				}
				if left := carrying(cmd.Mark); len(left) > 0 {
					t.Errorf("native %v: processes %v of the command left running", native, left)
				}
				out, errOut := strings.ReplaceAll(stdout.String(), nonce, "NONCE"), strings.ReplaceAll(stderr.String(), nonce, "NONCE")
				return code, out, errOut
			}
			code, stdout, stderr := run(true)
			scode, sstdout, sstderr := run(false)
			sstderr = strings.TrimSuffix(sstderr, tt.wrapper)
			if tt.vague {
				stderr, sstderr = strconv.FormatBool(strings.TrimSpace(stderr) != ""), strconv.FormatBool(strings.TrimSpace(sstderr) != "")
			}
			if code != tt.code || code != scode || stdout != sstdout || stderr != sstderr {
				t.Errorf("native: exit %d, stdout %q, stderr %q\nthe script: exit %d, stdout %q, stderr %q\nwant exit %d from both",
					code, stdout, stderr, scode, sstdout, sstderr, tt.code)
			}
		})
	}
}
