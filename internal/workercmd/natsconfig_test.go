package workercmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// TestNATSConfigCommand: `worker nats-config` writes a configuration nats-server loads and one
// .creds file per identity of the config's tenants, and refuses to overwrite a generation.
func TestNATSConfigCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nats")
	cfg := filepath.Join(t.TempDir(), "boxcar.yaml")
	if err := os.WriteFile(cfg, []byte("profiles:\n  p:\n    model:\n      name: m\n    tools:\n      - name: read_file\ntenants:\n  team-a:\n    profiles: [p]\n  team-b:\n    profiles: [p]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, _, err := runWorker(t, "nats-config", "--config", cfg, "--out", dir, "--listen", "127.0.0.1:-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := server.ProcessConfigFile(filepath.Join(dir, "nats-server.conf")); err != nil {
		t.Errorf("nats-server cannot load what nats-config wrote: %v", err)
	}
	for _, id := range []string{"team-a-submitter", "team-a-approver", "team-b-submitter", "team-b-approver", "worker", "operator"} {
		path := filepath.Join(dir, "creds", id+".creds")
		if _, err := os.Stat(path); err != nil {
			t.Errorf("no creds for %s: %v", id, err)
		}
		if !strings.Contains(stdout, path) {
			t.Errorf("the output does not name %s:\n%s", path, stdout)
		}
	}
	if _, _, err := runWorker(t, "nats-config", "--config", cfg, "--out", dir); err == nil {
		t.Error("a second generation into the same folder was accepted")
	}
	if _, _, err := runWorker(t, "nats-config", "--config", cfg); err == nil || !strings.Contains(err.Error(), "--out") {
		t.Errorf("no --out: %v; want an error naming --out", err)
	}
}
