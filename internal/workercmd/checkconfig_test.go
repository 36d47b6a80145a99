package workercmd

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/boxcar-run/boxcar/internal/cli"
)

var update = flag.Bool("update", false, "rewrite the golden files of the tests that have one")

// TestCheckConfigGolden runs `worker check-config` on each config in testdata/check-config (ten
// broken, one valid) and compares what it prints, every problem with its file:line:col and key
// path, and the exit code, with testdata/check-config.golden. `go test -run
// TestCheckConfigGolden -update` rewrites the golden file after a deliberate change.
func TestCheckConfigGolden(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "check-config", "*.yaml"))
	if err != nil || len(files) < 11 {
		t.Fatalf("testdata/check-config: %d files, %v", len(files), err)
	}
	var got bytes.Buffer
	for _, f := range files {
		var out bytes.Buffer
		err := Run(t.Context(), []string{"check-config", f}, noEnv, &out, &out)
		code, msg := cli.ExitCode(err)
		fmt.Fprintf(&got, "== worker check-config %s: exit %d\n%s", filepath.ToSlash(f), code, out.String())
		cli.PrintError(&got, "worker", msg)
	}
	golden := filepath.Join("testdata", "check-config.golden")
	if *update {
		if err := os.WriteFile(golden, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("worker check-config output differs from %s (run with -update after a deliberate change):\n%s", golden, got.String())
	}
}

// TestCheckConfigReadsTheStartEnvironment: what a worker takes from its environment at start
// (NATS_URL and BOXCAR_STORE in TestURLCredentialsNeverInOutput; here the NATS login and TLS
// files, the CA files) stops check-config with the error the worker's start gives (and setup's,
// where it reads the variable), naming the variable and holding no secret. check-config
// checked the file alone and said ok to what the worker then refused.
func TestCheckConfigReadsTheStartEnvironment(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	seedFile := filepath.Join(dir, "user.nk") // a seed where a .creds file belongs
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	const token = "tok-s3cr-123"
	tests := []struct {
		name string
		env  map[string]string
		want string   // in the error of each entry point
		skip []string // entry points that do not read it
	}{
		{name: "creds file missing", env: map[string]string{"NATS_CREDS": missing}, want: "NATS_CREDS"},
		{name: "nkey file missing", env: map[string]string{"NATS_NKEY": missing}, want: "NATS_NKEY"},
		{name: "CA file missing", env: map[string]string{"NATS_CA": missing}, want: "NATS_CA"},
		{name: "password file missing", env: map[string]string{"NATS_USER": "ann", "NATS_PASSWORD_FILE": missing}, want: "NATS_PASSWORD_FILE"},
		{name: "two logins", env: map[string]string{"NATS_USER": "ann", "NATS_TOKEN": token}, want: "a user and a token"},
		{name: "a seed as the creds file", env: map[string]string{"NATS_CREDS": seedFile}, want: "holds no user JWT"},
		{name: "model CA missing", env: map[string]string{"BOXCAR_MODEL_CA": missing}, want: "BOXCAR_MODEL_CA", skip: []string{"worker setup"}},
		{name: "S3 CA missing", env: map[string]string{"BOXCAR_S3_CA": missing}, want: "BOXCAR_S3_CA", skip: []string{"worker setup"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfgPath, _ := urlConfig(t, "nats.url", "nats://127.0.0.1:1", false)
			getenv := func(k string) string { return tt.env[k] }
			for entry, run := range urlEntryPoints(cfgPath, getenv) {
				if slices.Contains(tt.skip, entry) {
					continue
				}
				out, err := run(t.Context())
				all := fmt.Sprint(err) + "\n" + out
				if err == nil || !strings.Contains(all, tt.want) {
					t.Errorf("%s: %v; want an error naming %q\n%s", entry, err, tt.want, out)
				}
				if strings.Contains(all, token) || strings.Contains(all, string(seed)) {
					t.Errorf("%s: a secret reaches the output:\n%s", entry, all)
				}
			}
		})
	}

	// A flag names itself, as the worker's does.
	cfgPath, _ := urlConfig(t, "nats.url", "nats://127.0.0.1:1", false)
	var out bytes.Buffer
	err = Run(t.Context(), []string{"check-config", "--nats-creds", missing, "--model-ca", missing, cfgPath}, noEnv, &out, &out)
	if code, _ := cli.ExitCode(err); code != 1 || !strings.Contains(out.String(), "--nats-creds: ") || !strings.Contains(out.String(), "--model-ca: ") {
		t.Errorf("check-config with flags: exit %d, %v; want 1 and a line for each flag\n%s", code, err, out.String())
	}
}
