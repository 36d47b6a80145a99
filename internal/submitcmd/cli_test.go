package submitcmd

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docsUsageBlock returns the fenced block under the "submit" heading of docs/cli.md.
func docsUsageBlock(t *testing.T) (file, block string) {
	t.Helper()
	heading := regexp.MustCompile(`^#{2,3} submit\s*$`)
	for _, name := range []string{"docs/cli.md"} {
		path := filepath.Join("..", "..", name)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		state := 0 // 0 before the heading, 1 before the fence, 2 inside it
		var b strings.Builder
		for sc.Scan() {
			line := sc.Text()
			switch {
			case state == 0 && heading.MatchString(line):
				state = 1
			case state == 1 && strings.HasPrefix(line, "```"):
				state = 2
			case state == 2 && strings.HasPrefix(line, "```"):
				return name, b.String()
			case state == 2:
				b.WriteString(line + "\n")
			}
		}
		t.Fatalf("%s has no fenced usage block under a \"submit\" heading", name)
	}
	return "", ""
}

// TestUsageMatchesDocs fails when the commands or flags drift from the docs' usage block.
func TestUsageMatchesDocs(t *testing.T) {
	file, block := docsUsageBlock(t)
	want := Synopsis(newRoot(&env{getenv: func(string) string { return "" }, stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}))
	if block != want {
		t.Errorf("the usage block in %s differs from the commands; replace it with:\n%s\nit is:\n%s", file, want, block)
	}
}

func TestHelp(t *testing.T) {
	commands := []string{"run", "status", "watch", "get", "cancel", "manifest", "verify", "keygen", "version", "approvals", "approve", "deny", "gc", "completion"}
	tests := []struct {
		args     []string
		code     int
		contains []string
	}{
		{[]string{"--help"}, 0, append([]string{"Usage:", "Exit codes"}, commands...)},
		{[]string{"-h"}, 0, commands},
		{[]string{"help"}, 0, commands},
		{nil, 1, commands}, // no command: the usage, and a failure
		{[]string{"run", "--help"}, 0, []string{"--profile NAME", "--task TEXT", "--input FILE", "--label k=v", "--wait", "--timeout DURATION", "--output text|json", "--nats URL"}},
		{[]string{"help", "cancel"}, 0, []string{"submit cancel JOB_ID"}},
		{[]string{"deny", "--help"}, 0, []string{"--reason TEXT", "approval_timeout"}},
		{[]string{"keygen", "-h"}, 0, []string{"--out DIR", "never replaced"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			stdout, _, err := noEnv(t, tt.args...)
			if code := exitCode(err); code != tt.code {
				t.Errorf("exit %d (%v), want %d", code, err, tt.code)
			}
			for _, s := range tt.contains {
				if !strings.Contains(stdout, s) {
					t.Errorf("help does not mention %q:\n%s", s, stdout)
				}
			}
		})
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		stdout, _, err := noEnv(t, args...)
		if err != nil || !regexp.MustCompile(`^submit \S+`).MatchString(stdout) || strings.Count(stdout, "\n") != 1 {
			t.Errorf("submit %s = %q, %v; want one line: submit VERSION …", args[0], stdout, err)
		}
	}
}

func TestCompletion(t *testing.T) {
	tests := []struct {
		shell string
		want  string // a line only that shell's script has
	}{
		{"bash", "complete -o default -F __start_submit submit"},
		{"zsh", "#compdef submit"},
		{"fish", "complete -c submit"},
	}
	for _, tt := range tests {
		t.Run(tt.shell, func(t *testing.T) {
			stdout, _, err := noEnv(t, "completion", tt.shell)
			if err != nil || !strings.Contains(stdout, tt.want) {
				t.Errorf("completion %s: %v; want a script with %q, got %d bytes", tt.shell, err, tt.want, len(stdout))
			}
		})
	}
	// The scripts ask the binary itself; what it answers is what a user sees on TAB.
	stdout, _, err := noEnv(t, "__complete", "run", "--output", "")
	if err != nil || !strings.Contains(stdout, "text\njson\n") {
		t.Errorf("completing run --output: %v\n%s", err, stdout)
	}
	stdout, _, err = noEnv(t, "__complete", "")
	for _, c := range []string{"run", "cancel", "verify", "completion"} {
		if err != nil || !strings.Contains(stdout, c+"\t") {
			t.Errorf("completing a command does not offer %s: %v\n%s", c, err, stdout)
		}
	}
	for _, args := range [][]string{{"completion"}, {"completion", "powershell"}, {"completion", "bash", "zsh"}} {
		if _, _, err := noEnv(t, args...); exitCode(err) != 1 || !strings.Contains(message(err), "bash, zsh or fish") {
			t.Errorf("submit %s: %v; want exit 1 naming the shells", strings.Join(args, " "), err)
		}
	}
}

// TestUsageErrors covers every command's flag and argument errors: exit 1, a message that says
// what to give, and nothing sent anywhere (NATS_URL points at a port nobody listens on, so a
// check that moved after connecting would fail with a connection error instead).
func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"run"}, "--profile and --task are required"},
		{[]string{"run", "--profile", "p"}, "--profile and --task are required"},
		{[]string{"run", "--task", "t"}, "--profile and --task are required"},
		{[]string{"run", "--profile", "p", "--task", "   "}, "--profile and --task are required"},
		{[]string{"run", "--profile", "p", "--task", "t", "extra"}, "run: takes no arguments"},
		{[]string{"run", "--profile", "p", "--task", "t", "--label", "novalue"}, `--label "novalue": use key=value`},
		{[]string{"run", "--profile", "p", "--task", "t", "--input", filepath.Join(dir, "missing.csv")}, "missing.csv: no such file"},
		{[]string{"run", "--profile", "p", "--task", "t", "--input", dir}, "is not a regular file"},
		{[]string{"run", "--profile", "p", "--task", "t", "--timeout", "soon"}, `invalid argument "soon" for "--timeout"`},
		{[]string{"run", "--profile", "p", "--task", "t", "--output", "yaml"}, `--output "yaml": use text or json`},
		{[]string{"run", "--frob"}, "unknown flag: --frob (see `submit run --help`)"},
		// main prints "submit: " first: the root's flag error names no command ("submit: bad
		// usage: submit: unknown flag" before).
		{[]string{"--frob"}, "usage: unknown flag: --frob (see `submit --help`)"},
		{[]string{"status"}, "status: give one JOB_ID"},
		{[]string{"status", "a", "b"}, "status: give one JOB_ID"},
		{[]string{"status", "20261202t101500-abcdef012345", "--output", "xml"}, `--output "xml"`},
		{[]string{"watch"}, "watch: give one JOB_ID"},
		{[]string{"watch", "x", "--timeout", "-"}, `invalid argument "-" for "--timeout"`},
		{[]string{"get", "20261202t101500-abcdef012345"}, "get: give one JOB_ID and --out DIR"},
		{[]string{"get", "--out", dir}, "get: give one JOB_ID and --out DIR"},
		{[]string{"get", "../etc", "--out", dir}, `get: "../etc" is not a job id`},
		{[]string{"get", "20261202t101500-abcdef012345", "--out", dir, "--output", "xml"}, `--output "xml"`},
		{[]string{"cancel"}, "cancel: give one JOB_ID"},
		{[]string{"cancel", "a", "b"}, "cancel: give one JOB_ID"},
		{[]string{"manifest"}, "manifest: give one JOB_ID"},
		{[]string{"manifest", "Not_An_Id"}, `manifest: "Not_An_Id" is not a job id`},
		{[]string{"verify"}, "verify: give one JOB_ID"},
		{[]string{"verify", "../x"}, `verify: "../x" is not a job id`},
		{[]string{"verify", "20261202t101500-abcdef012345", "--public-key", filepath.Join(dir, "none.pub")}, "--public-key: provenance: key file"},
		{[]string{"keygen"}, "keygen: --out DIR is required"},
		{[]string{"keygen", "--out", dir, "extra"}, "keygen: takes no arguments"},
		{[]string{"keygen", "--nats", "nats://x"}, "unknown flag: --nats"},
		{[]string{"version", "x"}, "version: takes no arguments"},
		{[]string{"approvals", "a", "b"}, "approvals: give at most one JOB_ID"},
		{[]string{"approve", "a"}, "approve: give JOB_ID and CALL_ID"},
		{[]string{"approve", "a", "b", "c"}, "approve: give JOB_ID and CALL_ID"},
		{[]string{"approve", "a", "b", "--reason", "no"}, "unknown flag: --reason"},
		{[]string{"deny"}, "deny: give JOB_ID and CALL_ID"},
		{[]string{"deny", "20261202t101500-abcdef012345", "b", "--reason", strings.Repeat("x", 1001)}, "deny: --reason is 1001 bytes; keep it under 1000"},
		{[]string{"list", "--since", "-2h"}, "list: --since -2h0m0s: give a duration of 0 or more"},
		{[]string{"run", "--profile", "p", "--task", "t", "--timeout", "-1m"}, "run: --timeout -1m0s: give a positive duration"},
		{[]string{"run", "--jobs", "-", "--timeout", "0s"}, "run: --timeout 0s: give a positive duration"},
		{[]string{"watch", "20261202t101500-abcdef012345", "--timeout", "-5s"}, "watch: --timeout -5s: give a positive duration"},
		{[]string{"list", "--nats", "nats://boxcar:s3cr%ZZet@127.0.0.1:1"}, "--nats: does not parse as a URL (invalid URL escape)"},
		{[]string{"gc", "x"}, "gc: takes no arguments"},
		{[]string{"gc", "--older-than", "0s"}, "gc: --older-than 0s: give a duration longer than the workers' job_timeout plus ack_wait"},
		{[]string{"gc", "--older-than", "a day"}, `invalid argument "a day" for "--older-than"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, _, err := noEnv(t, tt.args...)
			if code := exitCode(err); code != 1 || !strings.Contains(message(err), tt.want) {
				t.Errorf("exit %d, %q; want exit 1 and %q", code, message(err), tt.want)
			}
		})
	}
}

// TestNoServer: a command that needs NATS says what to start.
func TestNoServer(t *testing.T) {
	for _, args := range [][]string{{"status", "20261202t101500-abcdef012345"}, {"run", "--profile", "p", "--task", "t"}, {"approvals"}, {"gc"}} {
		_, _, err := noEnv(t, args...)
		if exitCode(err) != 1 || !strings.Contains(message(err), "worker --embedded") {
			t.Errorf("submit %s without NATS: %v; want exit 1 saying how to start a worker", args[0], err)
		}
	}
}
