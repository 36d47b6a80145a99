//go:build integration

package agent_test

// The hostile-input cases that need a real bubblewrap sandbox (the integration tier).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// TestHostileSymlinksRealSandbox plants symlinks out of the workdir in a real bubblewrap
// sandbox (as a command the model ran earlier could) and has the model go through them with
// the file tools. The worker resolves every path beneath the workdir, so each is refused, the
// host file behind them is never read or written, and a command given the link runs inside
// the sandbox, where the host path does not exist.
func TestHostileSymlinksRealSandbox(t *testing.T) {
	hostDir := t.TempDir()
	secret := "boxcar-host-secret-" + time.Now().Format("150405.000000000")
	secretPath := filepath.Join(hostDir, "secret.txt")
	if err := os.WriteFile(secretPath, []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{})
	ctx := context.Background()
	plant := [][]string{
		{"ln", "-s", secretPath, "abs_secret"},
		{"ln", "-s", strings.Repeat("../", 12) + strings.TrimPrefix(secretPath, "/"), "rel_secret"},
		{"ln", "-s", "/", "rootdir"},
		{"ln", "-s", hostDir, "hostdir"},
		{"ln", "-s", "/etc/passwd", "passwd"},
		{"ln", "-s", "/proc/self/root", "proc_root"},
		{"ln", "-s", "loop", "loop"},
		{"mkdir", "sub"},
		{"ln", "-s", "../..", "sub/up"},
		// A folder nested past PATH_MAX, which the worker cannot list: it must not hide the
		// rest of the workdir from list_files.
		// (made in two halves, since no one path to it may be that long).
		{"mkdir", "-p", "deep/" + strings.Repeat("a/", 1100), "half/" + strings.Repeat("a/", 1100)},
		{"mv", "half", "deep/" + strings.Repeat("a/", 1100)},
	}
	for _, argv := range plant {
		res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: argv, Timeout: 30 * time.Second})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("plant %q: exit %d, %v: %s", argv, res.ExitCode, err, res.Stderr)
		}
	}

	calls := []struct {
		call
		wantPrefix string // of the result's error; "" means the call succeeds
	}{
		{call{"s1", "read_file", `{"path": "abs_secret"}`}, `path "abs_secret" outside the workdir`},
		{call{"s2", "read_file", `{"path": "rel_secret"}`}, `path "rel_secret" outside the workdir`},
		{call{"s3", "read_file", `{"path": "rootdir/etc/passwd"}`}, `path "rootdir/etc/passwd" outside the workdir`},
		{call{"s4", "read_file", `{"path": "hostdir/secret.txt"}`}, `path "hostdir/secret.txt" outside the workdir`},
		{call{"s5", "read_file", `{"path": "passwd"}`}, `path "passwd" outside the workdir`},
		{call{"s6", "read_file", `{"path": "proc_root/etc/passwd"}`}, `path "proc_root/etc/passwd" outside the workdir`},
		{call{"s7", "read_file", `{"path": "loop"}`}, `path "loop" outside the workdir`},
		{call{"s8", "read_file", `{"path": "sub/up/etc/passwd"}`}, `path "sub/up/etc/passwd" outside the workdir`},
		{call{"s9", "list_files", `{"path": "hostdir"}`}, `path "hostdir" outside the workdir`},
		{call{"s10", "list_files", `{"path": "rootdir"}`}, `path "rootdir" outside the workdir`},
		{call{"s11", "write_file", `{"path": "hostdir/pwned.txt", "content": "pwned"}`}, `path "hostdir/pwned.txt" outside the workdir`},
		{call{"s12", "write_file", `{"path": "sub/up/pwned.txt", "content": "pwned"}`}, `path "sub/up/pwned.txt" outside the workdir`},
		// The link is in the workdir; the host file behind it is not. cat follows it inside the
		// sandbox, where that host path does not exist.
		{call{"s13", "cat_file", `{"path": "abs_secret"}`}, ""},
		// Writing to a link's name replaces the link in the workdir; the host file is untouched.
		{call{"s14", "write_file", `{"path": "abs_secret", "content": "replaced"}`}, ""},
		// The folder nested past PATH_MAX is named as left out; the files beside it are listed.
		{call{"s15", "list_files", `{}`}, ""},
	}
	var scripted []call
	for _, c := range calls {
		scripted = append(scripted, c.call)
	}
	s := newScript(t, toolCalls(100, scripted...), final("done"))
	p := csvProfile(t, catTool)
	p.Limits.MaxToolCalls = len(calls)
	res, err := newAgent(t, s).Run(ctx, request(p, sb))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	_, results := toolResults(t, s.requests()[1])
	if len(results) != len(calls) {
		t.Fatalf("%d tool results, want %d", len(results), len(calls))
	}
	for i, c := range calls {
		msg, _ := results[i]["error"].(string)
		switch {
		case c.wantPrefix != "" && !strings.HasPrefix(msg, c.wantPrefix):
			t.Errorf("%s %s: the model saw %v, want an error starting %q", c.name, c.args, results[i], c.wantPrefix)
		case c.wantPrefix == "" && msg != "":
			t.Errorf("%s %s: failed with %q", c.name, c.args, msg)
		}
	}
	if code := results[12]["exit_code"]; code == 0.0 {
		t.Errorf("cat of the planted link succeeded inside the sandbox: %v", results[12])
	}
	if files, _ := results[14]["files"].([]any); len(files) == 0 || !strings.Contains(fmt.Sprint(results[14]["unreadable"]), "deep/a/a") {
		t.Errorf("list_files of a workdir with a folder nested past PATH_MAX = %.300v, want its files and the folder named as unreadable", results[14])
	}
	if data, err := os.ReadFile(secretPath); err != nil || string(data) != secret {
		t.Errorf("the host file behind the links is %q, %v; want it unchanged", data, err)
	}
	if entries, _ := os.ReadDir(hostDir); len(entries) != 1 {
		t.Errorf("the host folder holds %d entries, want only secret.txt", len(entries))
	}
	for i, r := range s.requests() {
		if strings.Contains(string(r.raw), secret) {
			t.Errorf("request %d to the model holds the host secret", i+1)
		}
	}
	if strings.Contains(string(res.Transcript), secret) {
		t.Error("the transcript holds the host secret")
	}
	if got, err := sb.ReadFile(ctx, "abs_secret", 100); err != nil || string(got) != "replaced" {
		t.Errorf("abs_secret in the workdir = %q, %v; want the regular file write_file made", got, err)
	}
}

// TestAllowlistProgramHoldingASpaceRealSandbox: under "ls *" the model makes a folder "ls "
// with write_file and asks for argv[0] "ls /../../…/bin/sh", which execvp would resolve from
// the workdir through that folder to /bin/sh. The allowlist matches argv element by element,
// so that program is not "ls" and nothing runs.
func TestAllowlistProgramHoldingASpaceRealSandbox(t *testing.T) {
	sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{})
	shell := config.Tool{Name: "shell", Kind: config.ToolShell, Policy: config.PolicyAllowlist, Allow: []string{"ls *"}}
	s := newScript(t,
		toolCalls(100,
			call{"w1", "write_file", `{"path": "ls /x", "content": ""}`},
			call{"sh1", "shell", `{"command": ["ls /` + strings.Repeat("../", 8) + `bin/sh", "-c", "echo PWNED-$((6*7))"]}`},
		),
		final("done"))
	if _, err := newAgent(t, s).Run(context.Background(), request(csvProfile(t, shell), sb)); err != nil {
		t.Fatalf("Run: %v", err)
	}
	got := lastToolResult(t, s.requests()[1])
	if msg, _ := got["error"].(string); !strings.HasPrefix(msg, "refused: argv [") || strings.Contains(fmt.Sprint(got), "PWNED-42") {
		t.Errorf("with only \"ls *\" allowed, argv[0] \"ls /…/bin/sh\" got %v; want it refused by the policy", got)
	}
}
