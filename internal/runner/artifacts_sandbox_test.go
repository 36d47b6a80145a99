//go:build integration

package runner

// The artifact cases that need a real bubblewrap sandbox (the integration tier).

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// TestCollectArtifactsSkipsSymlinks runs a real bubblewrap sandbox whose artifact folder holds
// symbolic links to a host file, to a folder, to an input and to a file in the folder itself:
// only the regular files are taken, and no link is followed.
func TestCollectArtifactsSkipsSymlinks(t *testing.T) {
	t.Parallel()
	p := sandboxtest.Bubblewrap(t)
	ctx := t.Context()
	sb := sandboxtest.StartSpec(t, p, config.SandboxSpec{})
	for name, data := range map[string]string{"input.csv": "secret,input\n", "artifacts/table.csv": "a,b\n1,2\n", "artifacts/sub/notes.txt": "notes\n"} {
		if err := sb.WriteFile(ctx, name, []byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	links := [][2]string{
		{"/etc/passwd", "artifacts/passwd"},
		{"/etc", "artifacts/etc"},
		{"../input.csv", "artifacts/input-link.csv"},
		{"table.csv", "artifacts/table-link.csv"},
		{"../../../../../../etc/hostname", "artifacts/sub/hostname"},
	}
	for _, l := range links {
		res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"ln", "-s", l[0], l[1]}, Timeout: 30 * time.Second})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("ln -s %s %s: %v, exit %d: %s", l[0], l[1], err, res.ExitCode, res.Stderr)
		}
	}

	outs, err := (&Runner{}).collectArtifacts(ctx, testAttempt("artifacts"), sb, &provenance.Collected{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"artifacts/sub/notes.txt", "artifacts/table.csv"}
	if got := names(outs); !slices.Equal(got, want) {
		t.Errorf("artifacts = %q, want the regular files %q only", got, want)
	}
	for _, o := range outs {
		rc, err := o.open(ctx)
		if err != nil {
			t.Fatalf("open %s: %v", o.name, err)
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || strings.Contains(string(data), "root:") || strings.Contains(string(data), "secret,input") {
			t.Errorf("%s: %q, %v; want the file's own bytes, never a link's target", o.name, data, err)
		}
	}
	// A listed file changed into a link to another file inside (the input) is not followed
	// when it is read for the upload.
	if res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "rm artifacts/table.csv && ln -s ../input.csv artifacts/table.csv"}, Timeout: 30 * time.Second}); err != nil || res.ExitCode != 0 {
		t.Fatalf("swap table.csv for a link: %v, %s", err, res.Stderr)
	}
	for _, o := range outs {
		if o.name != "artifacts/table.csv" {
			continue
		}
		if rc, err := o.open(ctx); !errors.Is(err, sandbox.ErrPathEscape) {
			if rc != nil {
				rc.Close()
			}
			t.Errorf("open %s after it became a link: err = %v, want ErrPathEscape", o.name, err)
		}
	}

	// The artifact folder itself a link out of the workdir: nothing is taken, and the run
	// does not fail.
	if res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"ln", "-s", "/etc", "out"}, Timeout: 30 * time.Second}); err != nil || res.ExitCode != 0 {
		t.Fatalf("ln -s /etc out: %v, %s", err, res.Stderr)
	}
	outs, err = (&Runner{}).collectArtifacts(ctx, testAttempt("out"), sb, &provenance.Collected{})
	if err != nil || len(outs) != 0 {
		t.Errorf("artifact folder linked to /etc: %q, %v; want nothing and no error", names(outs), err)
	}
	// Nor when the model made the artifact folder a file.
	outs, err = (&Runner{}).collectArtifacts(ctx, testAttempt("input.csv"), sb, &provenance.Collected{})
	if err != nil || len(outs) != 0 {
		t.Errorf("artifact folder is a file: %q, %v; want nothing and no error", names(outs), err)
	}
}
