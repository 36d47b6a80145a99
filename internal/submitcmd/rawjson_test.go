package submitcmd

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/creack/pty"

	"github.com/boxcar-run/boxcar/internal/provenance"
)

// TestManifestJSONReachesATerminalEscaped: `manifest --output json` prints the stored manifest
// byte for byte into a pipe or a file, the bytes its signature covers, and on a terminal
// escaped as every other output is: the manifest is whatever a writer of the store put there,
// unparsed, and it printed an escape sequence in it (a window's title set, the screen cleared)
// raw to the terminal.
func TestManifestJSONReachesATerminalEscaped(t *testing.T) {
	te := newTestEnv(t)
	id := te.commitSucceeded(t)
	planted := "{\"x\":\"\x1b]0;pwned\x07\x1b[2J\u202e\"}"
	if err := te.st.Put(t.Context(), provenance.ManifestKey(id), strings.NewReader(planted), -1); err != nil {
		t.Fatal(err)
	}
	args := []string{"manifest", id, "--output", "json", "--store", "file://" + te.storeDir}

	var piped, stderr bytes.Buffer
	if err := run(t.Context(), &env{getenv: te.getenv, stdout: &piped, stderr: &stderr, publish: defaultPublishPolicy}, args); err != nil {
		t.Fatalf("manifest into a pipe: %v\n%s", err, stderr.String())
	}
	if piped.String() != planted+"\n" {
		t.Errorf("manifest into a pipe printed %q; want the stored bytes %q", piped.String(), planted)
	}

	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	defer ptmx.Close()
	screen := make(chan string, 1)
	go func() {
		data, _ := io.ReadAll(ptmx) // ends with EIO once the terminal's side is closed
		screen <- string(data)
	}()
	err = run(t.Context(), &env{getenv: te.getenv, stdout: tty, stderr: &stderr, publish: defaultPublishPolicy}, args)
	tty.Close()
	if err != nil {
		t.Fatalf("manifest on a terminal: %v\n%s", err, stderr.String())
	}
	if got := <-screen; strings.ContainsAny(got, "\x1b\x07\u202e") || !strings.Contains(got, `\u001b]0;pwned`) {
		t.Errorf("manifest on a terminal printed %q; want every control and format character escaped", got)
	}
}
