package workercmd

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestEmbeddedKeepsTheConfiguredSandbox: --embedded replaces NATS and the store, never the
// sandbox backend the operator chose. A kubernetes config outside a cluster must fail as
// kubernetes does, not quietly run jobs in bubblewrap on the host.
func TestEmbeddedKeepsTheConfiguredSandbox(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "boxcar.yaml")
	if err := os.WriteFile(cfg, []byte("sandbox:\n  backend: kubernetes\nprofiles:\n  p:\n    model:\n      name: m\n    tools:\n      - name: read_file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	env := map[string]string{}
	// A worker that started anyway would run until its context ends.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	err := Run(ctx, []string{"--embedded", "--config", cfg, "--data-dir", dir, "--nats-listen", "127.0.0.1:0", "--metrics-addr", "off"},
		func(k string) string { return env[k] }, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "kubernetes: not in a cluster") {
		t.Fatalf("worker --embedded with a kubernetes config: %v\n%s\nwant the kubernetes backend's error", err, out.String())
	}
}
