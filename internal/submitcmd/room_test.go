package submitcmd

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/store"
)

// claimSize makes the run's file file (report.md, transcript.jsonl) size bytes of zeros, as a
// store writer without the signing key can: a sparse file in the file store, costing no disk,
// and a manifest recording its digest and size.
func (te *testEnv) claimSize(t *testing.T, id, file string, size int64) {
	t.Helper()
	h := sha256.New()
	if _, err := io.CopyN(h, zeros{}, size); err != nil {
		t.Fatal(err)
	}
	te.forgeManifest(t, id, func(stmt *provenance.Statement) {
		for i, s := range stmt.Subjects {
			if s.Name != file {
				continue
			}
			stmt.Subjects[i].SHA256, stmt.Subjects[i].Size = hex.EncodeToString(h.Sum(nil)), size
			if err := os.Truncate(filepath.Join(te.storeDir, filepath.FromSlash(store.TenantPrefix(job.DefaultTenant)+provenance.SubjectKey(id, s))), size); err != nil {
				t.Fatal(err)
			}
		}
	})
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestClaimedSizeCannotFillTheDisk: a manifest nothing vouches for (no key anywhere) that
// records a file larger than the free space get or logs would copy it into is refused before
// a byte is read, the error saying where there is no room and what to do; a run that fits is
// shown and downloaded as ever. Each command runs on a 128 MiB tmpfs of its own (a mount
// namespace, unshare), its TMPDIR and --out there. logs copied the transcript into TMPDIR and
// get the report into --out at whatever size the manifest records: a 256 MiB file filled the
// tmpfs (on main: "no space left on device" in all 2 refused rows, the tmpfs full).
func TestClaimedSizeCannotFillTheDisk(t *testing.T) {
	if err := exec.Command("unshare", "-rm", "true").Run(); err != nil {
		t.Skipf("no mount namespace for a small file system: unshare -rm: %v", err)
	}
	te := newTestEnv(t)
	const claimed = 256 << 20
	fits, bigTranscript, bigReport := te.commitSucceeded(t), te.commitSucceeded(t), te.commitSucceeded(t)
	te.claimSize(t, bigTranscript, "transcript.jsonl", claimed)
	te.claimSize(t, bigReport, "report.md", claimed)
	noKeyHome := t.TempDir()
	for _, tt := range []struct {
		name string
		args []string
		home string
		code int
		want string
	}{
		{"logs, transcript too large", []string{"logs", bigTranscript}, noKeyHome, 1, "set TMPDIR to a folder with room"},
		{"get, report too large", []string{"get", bigReport, "--out", "$TMPDIR/run"}, noKeyHome, 1, "give --out a folder with room"},
		{"logs, a run that fits", []string{"logs", fits}, te.home, 0, "checked transcript.jsonl against the manifest's sha256 digest"},
		{"get, a run that fits", []string{"get", fits, "--out", "$TMPDIR/run"}, te.home, 0, "checked 2 files against the manifest's sha256 digests"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tmp := t.TempDir()
			args := append(slicesReplace(tt.args, "$TMPDIR", tmp), "--store", "file://"+te.storeDir)
			raw, _ := json.Marshal(args)
			cmd := exec.Command("unshare", "-rm", "sh", "-c", `mount -t tmpfs -o size=128m tmpfs "$0" && exec "$@"`, tmp, os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), asSubmit+"="+string(raw), "NATS_URL="+te.natsURL, "BOXCAR_HOME="+tt.home, "TMPDIR="+tmp)
			out, err := cmd.CombinedOutput()
			code := 0
			var ee *exec.ExitError
			switch {
			case errors.As(err, &ee):
				code = ee.ExitCode()
			case err != nil:
				t.Fatal(err)
			}
			if code != tt.code || !strings.Contains(string(out), tt.want) || strings.Contains(string(out), "no space left") {
				t.Errorf("exit %d, want %d and %q:\n%.2000s", code, tt.code, tt.want, out)
			}
		})
	}
}

// slicesReplace is args with old replaced by new in each.
func slicesReplace(args []string, old, new string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = strings.ReplaceAll(a, old, new)
	}
	return out
}
