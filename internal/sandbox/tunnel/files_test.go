package tunnel_test

import (
	"bytes"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/sandbox/tunnel"
)

// TestCommandsFileWrite: the session's own write (File) does what the backend's script
// (podscripts/file.sh, run by the same session through sh) does, case for case: the same exit
// code, the same failure line and the same files left on disk, inside the workdir and out of
// it. The native runs carry the argv `false`, so a pod's side that ran the argv instead would
// answer exit code 1 in every case.
func TestCommandsFileWrite(t *testing.T) {
	script, err := os.ReadFile("../podscripts/file.sh")
	if err != nil {
		t.Fatal(err)
	}
	c := commandSession(t)
	for _, tt := range []struct {
		name  string
		setup func(t *testing.T, root string) // root holds w (the workdir) and out
		path  string
		code  int
	}{
		{name: "new file", path: "a.txt"},
		{name: "new folders", path: "x/y/z.txt"},
		{name: "replaces a file", setup: file("w/a.txt", "old"), path: "a.txt"},
		{name: "symlink out is replaced", setup: link("w/l", "../out/secret"), path: "l"},
		{name: "symlink in is replaced", setup: both(file("w/t", "t"), link("w/l", "t")), path: "l"},
		{name: "folder symlink out", setup: link("w/o", "../out"), path: "o/f", code: 125},
		{name: "missing folders under a symlink out", setup: link("w/o", "../out"), path: "o/new/f", code: 125},
		{name: "dangling folder symlink out", setup: link("w/o", "../nowhere/x"), path: "o/f", code: 125},
		{name: "dangling folder symlink in", setup: link("w/o", "missing"), path: "o/f", code: 125},
		{name: "folder symlink in", setup: both(mkdir("w/sub"), link("w/in", "sub")), path: "in/f"},
		{name: "absolute symlink in the way", setup: link("w/o", "/"), path: "o/tmp/f", code: 125},
		{name: "a folder there", setup: mkdir("w/d"), path: "d", code: 125},
		{name: "a file on the way", setup: file("w/f", "x"), path: "f/x", code: 125},
		{name: "a name past NAME_MAX", path: strings.Repeat("n", 300), code: 125},
		{name: "a name past NAME_MAX on the way", path: strings.Repeat("n", 300) + "/f", code: 125},
		{name: "a name past NAME_MAX in a folder", setup: mkdir("w/d"), path: "d/" + strings.Repeat("n", 300), code: 125},
		{name: "workdir a symlink", setup: func(t *testing.T, root string) {
			must(t, os.Rename(filepath.Join(root, "w"), filepath.Join(root, "real")))
			link("w", "real")(t, root)
		}, path: "a/b"},
		{name: "no workdir", setup: func(t *testing.T, root string) { must(t, os.RemoveAll(filepath.Join(root, "w"))) }, path: "a", code: 125},
	} {
		t.Run(tt.name, func(t *testing.T) {
			run := func(native bool) (int, string, string) {
				root := t.TempDir()
				must(t, os.Mkdir(filepath.Join(root, "w"), 0o755))
				must(t, os.Mkdir(filepath.Join(root, "out"), 0o755))
				must(t, os.WriteFile(filepath.Join(root, "out", "secret"), []byte("keep"), 0o644))
				if tt.setup != nil {
					tt.setup(t, root)
				}
				w := filepath.Join(root, "w")
				cmd := tunnel.Command{Argv: []string{"sh", "-c", string(script), "boxcar-file", "write", "n0nce", w, tt.path}}
				if native {
					cmd.Argv = []string{"false"}
					cmd.File = &tunnel.File{Op: tunnel.FileWrite, Nonce: "n0nce", Dir: w, Path: tt.path}
				}
				var stdout, stderr bytes.Buffer
				cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader("new data"), &stdout, &stderr
				code, err := c.Run(t.Context(), cmd)
				if err != nil {
					t.Fatal(err)
				}
				return code, stderr.String(), tree(t, root)
			}
			code, stderr, files := run(true)
			scode, sstderr, sfiles := run(false)
			if code != tt.code || code != scode || stderr != sstderr || files != sfiles {
				t.Errorf("native write: exit %d, stderr %q, files\n%s\nthe script: exit %d, stderr %q, files\n%s\nwant exit %d from both",
					code, stderr, files, scode, sstderr, sfiles, tt.code)
			}
		})
	}
}

// TestCommandsFileRefused: a file operation the pod's side does not know, or a path that is
// not clean and relative, is refused without touching the disk.
func TestCommandsFileRefused(t *testing.T) {
	c := commandSession(t)
	w := t.TempDir()
	for _, f := range []tunnel.File{
		{Op: "delete", Path: "a"},
		{Op: tunnel.FileWrite, Path: "../a"},
		{Op: tunnel.FileWrite, Path: "/etc/a"},
		{Op: tunnel.FileWrite, Path: "x/../../a"},
		{Op: tunnel.FileWrite, Path: "."},
		{Op: tunnel.FileWrite, Path: ""},
		{Op: tunnel.FileWrite, Dir: "relative", Path: "a"},
	} {
		if f.Dir == "" {
			f.Dir = filepath.Join(w, "in")
			must(t, os.MkdirAll(f.Dir, 0o755))
		}
		f.Nonce = "n0nce"
		var stderr bytes.Buffer
		code, err := c.Run(t.Context(), tunnel.Command{Argv: []string{"true"}, File: &f, Stdin: strings.NewReader("x"), Stdout: &stderr, Stderr: &stderr})
		if err != nil || code != 125 || !strings.HasPrefix(stderr.String(), "boxcar-n0nce: ") {
			t.Errorf("%+v: exit %d, %v, %q; want 125 and the failure line", f, code, err, stderr.String())
		}
	}
	if got := tree(t, w); got != "in/ dir\n" {
		t.Errorf("the disk after the refusals:\n%s", got)
	}
}

// tree describes everything under root: paths, kinds, link targets and contents, sorted.
func tree(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	must(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			to, err := os.Readlink(p)
			b.WriteString(rel + " -> " + to + "\n")
			return err
		case d.IsDir():
			b.WriteString(rel + "/ dir\n")
		default:
			data, err := os.ReadFile(p)
			b.WriteString(rel + " " + string(data) + "\n")
			return err
		}
		return nil
	}))
	return b.String()
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func file(name, data string) func(*testing.T, string) {
	return func(t *testing.T, root string) {
		must(t, os.WriteFile(filepath.Join(root, name), []byte(data), 0o644))
	}
}

func link(name, to string) func(*testing.T, string) {
	return func(t *testing.T, root string) { must(t, os.Symlink(to, filepath.Join(root, name))) }
}

func mkdir(name string) func(*testing.T, string) {
	return func(t *testing.T, root string) { must(t, os.Mkdir(filepath.Join(root, name), 0o755)) }
}

func both(fs ...func(*testing.T, string)) func(*testing.T, string) {
	return func(t *testing.T, root string) {
		for _, f := range fs {
			f(t, root)
		}
	}
}

// TestCommandsFileWriteMode: a write with Mode has exactly those permission bits, whatever the
// umask (the egress CA's 0644 where a pod's umask may be tighter or looser); without, the
// umask's.
func TestCommandsFileWriteMode(t *testing.T) {
	c := commandSession(t)
	for _, tt := range []struct {
		name string
		mode fs.FileMode
		want fs.FileMode
	}{
		{name: "given", mode: 0o600, want: 0o600},
		{name: "given, wider than the umask", mode: 0o646, want: 0o646},
		{name: "umask", want: 0o666 &^ umask(t)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			f := &tunnel.File{Op: tunnel.FileWrite, Nonce: "n0nce", Dir: dir, Path: "ca.pem", Mode: tt.mode}
			code, err := c.Run(t.Context(), tunnel.Command{Argv: []string{"false"}, File: f, Stdin: strings.NewReader("pem"), Stdout: io.Discard, Stderr: io.Discard})
			if err != nil || code != 0 {
				t.Fatalf("Run = %d, %v", code, err)
			}
			fi, err := os.Stat(filepath.Join(dir, "ca.pem"))
			if err != nil || fi.Mode().Perm() != tt.want {
				t.Errorf("written with %v, %v; want %v", fi.Mode().Perm(), err, tt.want)
			}
		})
	}
}

// umask is the process's umask, as /proc says it (setting it to read it would race the pod
// side's writes).
func umask(t *testing.T) fs.FileMode {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "Umask:"); ok {
			m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32)
			if err != nil {
				t.Fatal(err)
			}
			return fs.FileMode(m)
		}
	}
	t.Fatal("no Umask in /proc/self/status")
	return 0
}
