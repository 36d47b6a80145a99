package spare

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// dumpArg makes the test binary, executed by Script, print what it was given (dumped).
const dumpArg = "spare-test-dump"

// dumped is what the command got; bytes, so that JSON keeps what is not UTF-8.
type dumped struct {
	Args, Env [][]byte
	Dir       string
	Stdin     []byte
}

func toBytes(s []string) [][]byte {
	b := make([][]byte, len(s))
	for i := range s {
		b[i] = []byte(s[i])
	}
	return b
}

func toStrings(b [][]byte) []string {
	s := make([]string, len(b))
	for i := range b {
		s[i] = string(b[i])
	}
	return s
}

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == dumpArg {
		dir, _ := os.Getwd()
		in, _ := io.ReadAll(os.Stdin)
		_ = json.NewEncoder(os.Stdout).Encode(dumped{Args: toBytes(os.Args), Env: toBytes(os.Environ()), Dir: dir, Stdin: in})
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runScript runs Script in the real /bin/sh as bwrap would (environment PWD only, ReadyFD
// open), tells it argv, env and dir, and returns what it said ready, its output and its exit
// status.
func runScript(t *testing.T, argv, env []string, dir string, input []byte) (ready bool, stdout, stderr []byte, code int) {
	t.Helper()
	req, err := Request(argv, env, dir, input != nil, "/usr/bin:/bin")
	if err != nil {
		t.Fatal(err)
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer readyR.Close()
	cmd := exec.Command("/bin/sh", "-c", Script)
	cmd.Env = []string{"PWD=/"}
	cmd.Dir = "/"
	cmd.Stdin = bytes.NewReader(append(req, input...))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.ExtraFiles = make([]*os.File, ReadyFD-3+1)
	cmd.ExtraFiles[ReadyFD-3] = readyW
	err = cmd.Start()
	readyW.Close()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(readyR)
	var exit *exec.ExitError
	if err := cmd.Wait(); err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return len(b) == 1, out.Bytes(), errOut.Bytes(), cmd.ProcessState.ExitCode()
}

// TestScriptQuoting runs commands through the real shell with argv and environment values
// that a shell would take apart unquoted, and random bytes: the command gets them exactly,
// and exactly the environment it is told (no PWD or OLDPWD of the shell's, nothing it
// exports of its own).
func TestScriptQuoting(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	weird := []string{"", " ", "'", `'\''`, "''", `"`, "$HOME", "${PATH}", "`id`", "$(id)", "a\nb", "\n", "\n\n", "x\r\ny", `\`, `\n`,
		"*", "?", "[a]", "~", "-", "--", "-e", "a b\tc", ";exit 7", "|", "&", "#", "!", "\xff\xfe\x80", "é", "=", "a=b", "%s",
		"'$nl'", `"$nl"`, "'\"$nl\"'", "$1", "$@", "\x01\x7f"}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		b := make([]byte, rng.IntN(40))
		for i := range b {
			b[i] = byte(1 + rng.IntN(255))
		}
		weird = append(weird, string(b))
	}
	env := []string{"PWD=" + dir, "IFS=x", "OPTIND=2", "PS4=+", "nl=job", "r=job", "OLDPWD=job's"}
	for i, w := range weird {
		env = append(env, "W"+string(rune('A'+i%26))+strings.Repeat("_", i/26)+"="+w)
	}
	tests := []struct {
		name  string
		env   []string
		input []byte
	}{
		{"weird words", env, nil},
		{"with input", []string{"PWD=" + dir}, []byte("line 1\nline 2 'x' $y\n")},
		{"empty input", []string{"PWD=" + dir}, []byte{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			argv := append([]string{self, dumpArg}, weird...)
			ready, out, errOut, code := runScript(t, argv, tt.env, dir, tt.input)
			if !ready || code != 0 {
				t.Fatalf("ready %v, exit %d: %s", ready, code, errOut)
			}
			var got dumped
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			gotArgv, gotEnv := toStrings(got.Args), toStrings(got.Env)
			slices.Sort(gotEnv)
			want := slices.Sorted(slices.Values(tt.env))
			if !slices.Equal(gotArgv, argv) || !slices.Equal(gotEnv, want) || got.Dir != dir || !bytes.Equal(got.Stdin, tt.input) {
				t.Errorf("the command got\nargv %q\nenv %q\ndir %q stdin %q\nwant\nargv %q\nenv %q\ndir %q stdin %q",
					gotArgv, gotEnv, got.Dir, got.Stdin, argv, want, dir, tt.input)
			}
		})
	}
}

// TestScriptFailures: a folder or program that cannot be used is reported as bwrap reports it.
func TestScriptFailures(t *testing.T) {
	dir := t.TempDir()
	for name, mode := range map[string]os.FileMode{"data": 0o644, "prog": 0o755} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("exit 3\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		argv       []string
		dir        string
		wantStderr string
		wantCode   int
	}{
		{"no folder", []string{"true"}, dir + "/gone", "bwrap: Can't chdir to " + dir + "/gone: No such file or directory\n", 1},
		{"a file for a folder", []string{"true"}, dir + "/data", "bwrap: Can't chdir to " + dir + "/data: Not a directory\n", 1},
		{"not on PATH", []string{"no-such-program"}, dir, "bwrap: execvp no-such-program: No such file or directory\n", 1},
		{"no such file", []string{"./gone"}, dir, "bwrap: execvp ./gone: No such file or directory\n", 1},
		{"not executable", []string{"./data"}, dir, "bwrap: execvp ./data: Permission denied\n", 1},
		{"a folder", []string{"./sub"}, dir, "bwrap: execvp ./sub: Permission denied\n", 1},
		{"a file on the way", []string{"./data/x"}, dir, "bwrap: execvp ./data/x: Not a directory\n", 1},
		{"a script without #! runs in sh, as execvp runs it", []string{"./prog"}, dir, "", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, errOut, code := runScript(t, tt.argv, []string{"PWD=" + tt.dir}, tt.dir, nil)
			if string(errOut) != tt.wantStderr || code != tt.wantCode {
				t.Errorf("exit %d, stderr %q; want exit %d, stderr %q", code, errOut, tt.wantCode, tt.wantStderr)
			}
		})
	}
}

// TestScriptWithoutRequest: a spare whose sandbox closes before a command came ends quietly.
func TestScriptWithoutRequest(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", Script)
	cmd.ExtraFiles = make([]*os.File, ReadyFD-3+1)
	cmd.ExtraFiles[ReadyFD-3] = os.Stdout
	if out, err := cmd.CombinedOutput(); err != nil || len(out) != 0 {
		t.Errorf("exit %v, output %q; want a quiet exit 0", err, out)
	}
}

func TestRequestRefuses(t *testing.T) {
	tests := []struct {
		name      string
		argv, env []string
	}{
		{"NUL in argv", []string{"echo", "a\x00b"}, nil},
		{"NUL in the environment", []string{"echo"}, []string{"A=a\x00b"}},
		{"a name a shell cannot export", []string{"echo"}, []string{"A-B=1"}},
		{"a name led by a digit", []string{"echo"}, []string{"1A=1"}},
		{"no name", []string{"echo"}, []string{"=1"}},
		{"OPTIND dash refuses", []string{"echo"}, []string{"OPTIND=x"}},
		{"longer than the shell reads quickly", []string{"echo", strings.Repeat("x", MaxRequest)}, nil},
		{"no program", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Request(tt.argv, tt.env, "/work", false, "/bin"); err == nil {
				t.Error("Request succeeded")
			}
		})
	}
}
