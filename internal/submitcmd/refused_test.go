package submitcmd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
	"github.com/boxcar-run/boxcar/internal/store/storetest"
)

// TestCredentialsTheServerRefuses: a NATS server that answers and refuses submit's credentials
// (a wrong token, none at all) is said to have refused them, exit 1, naming where credentials
// are given and never the token. It was said as a server nobody runs: "Authorization
// Violation (is a worker or nats-server running? start one with `worker --embedded` …)".
func TestCredentialsTheServerRefuses(t *testing.T) {
	const token = "the-servers-token-4f1c"
	ns := queuetest.Start(t, queue.EmbeddedOptions{Token: token})
	home := t.TempDir()
	wrong := filepath.Join(home, "wrong.token")
	if err := os.WriteFile(wrong, []byte("wrong-token-9e2a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, flags := range map[string][]string{"a wrong token": {"--nats-token-file", wrong}, "no credentials": nil} {
		for _, cmd := range [][]string{{"status", "0123456789abcdef"}, {"list"}, {"run", "--profile", "p", "--task", "t"}} {
			t.Run(name+" "+cmd[0], func(t *testing.T) {
				var stdout, stderr bytes.Buffer
				err := Run(t.Context(), append(cmd, flags...), func(k string) string {
					return map[string]string{"NATS_URL": ns.ClientURL(), "BOXCAR_HOME": home}[k]
				}, &stdout, &stderr)
				msg := message(err)
				if exitCode(err) != 1 || !strings.Contains(msg, "refused the credentials") || strings.Contains(msg, "is a worker or nats-server running") ||
					!strings.Contains(msg, "--nats-creds") || strings.Contains(msg, token) || strings.Contains(msg, "wrong-token") {
					t.Errorf("%s: exit %d, %q; want exit 1 saying the server refused the credentials and where they are given", cmd[0], exitCode(err), msg)
				}
			})
		}
	}
}

// TestFileStoreRefusedEndsAtOnce: a file store whose folders refuse the user submit runs as
// (a mode, an owner, an immutable or read-only directory) ends run at once, exit 1, naming
// the store and what to change in a file store's words, with nothing queued: no wait changes
// a file's mode. Before, run waited out its whole --timeout as for an outage of the store,
// then asked for the tenant's AWS_ACCESS_KEY_ID.
func TestFileStoreRefusedEndsAtOnce(t *testing.T) {
	te := newTestEnv(t)
	storetest.ReadOnly(t, te.storeDir)
	input := writeTestFile(t, t.TempDir(), "sales.csv", "region,total\nnorth,3\n")
	var stdout, stderr bytes.Buffer
	err := Run(t.Context(), []string{"run", "--profile", "csv-analyst", "--task", "t", "--input", input, "--timeout", "20s",
		"--store", "file://" + te.storeDir}, te.getenv, &stdout, &stderr)
	msg := message(err)
	t.Logf("exit %d: %s", exitCode(err), msg)
	if exitCode(err) != 1 || strings.Contains(msg, "gave up") || strings.Contains(stderr.String(), "waiting for") ||
		!strings.Contains(msg, te.storeDir) || strings.Contains(msg, "AWS_") {
		t.Errorf("run: exit %d (%q), stderr %q; want exit 1 at once naming %s, in a file store's words", exitCode(err), msg, stderr.String(), te.storeDir)
	}
	if got := te.jobMessages(t); got != 0 {
		t.Errorf("%d jobs queued, want none", got)
	}
}
