package submitcmd

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
)

// TestSubmitReachesARenamedFleet: a fleet whose config renames its stream, subject, consumer
// and buckets is reached by submit through that config (--config, or $BOXCAR_CONFIG): the job
// is published where the workers take it, and its status read from their bucket. Without the
// file submit looks for the default names, finds no queue, and says so.
func TestSubmitReachesARenamedFleet(t *testing.T) {
	t.Parallel()
	ns := queuetest.Start(t, queue.EmbeddedOptions{})
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "fleet.yaml")
	yaml := "nats:\n  url: " + ns.ClientURL() + "\n  stream: FLEET_JOBS\n  subject: fleet.jobs\n  consumer: fleet-workers\n" +
		"  status_bucket: FLEET_STATUS\n  dead_letter_stream: FLEET_DLQ\n  approvals_bucket: FLEET_APPROVALS\n" +
		"profiles:\n  p:\n    model: {name: m}\n    tools: [{name: read_file}]\n"
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	// The fleet's worker: its queue declared under the config's names, its profiles live.
	nc, err := queue.Connect(t.Context(), queue.ConnOptions{URL: ns.ClientURL(), Name: "fleet-worker"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	q, err := queue.Open(t.Context(), nc, cfg.NATS, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	advertised := make(chan struct{})
	go func() {
		defer close(advertised)
		_ = q.AdvertiseProfiles(ctx, "fleet-1", cfg.Profiles, cfg.TenantsOrDefault())
	}()
	t.Cleanup(func() { cancel(); <-advertised })

	home := t.TempDir()
	submit := func(env map[string]string, args ...string) (string, string, error) {
		env["BOXCAR_HOME"] = home
		var stdout, stderr bytes.Buffer
		err := Run(t.Context(), args, func(k string) string { return env[k] }, &stdout, &stderr)
		return stdout.String(), stderr.String(), err
	}
	c, err := queue.NewClient(t.Context(), nc, cfg.NATS, job.DefaultTenant)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the worker's profiles", func() bool { _, err := c.LiveProfiles(t.Context()); return err == nil })
	out, stderr, err := submit(map[string]string{}, "run", "--config", cfgPath, "--profile", "p", "--task", "t")
	if err != nil {
		t.Fatalf("submit run --config: %v\n%s", err, stderr)
	}
	id := strings.TrimSpace(out)
	if !job.ValidID(id) {
		t.Fatalf("submit run printed %q, want a job id", id)
	}
	out, stderr, err = submit(map[string]string{"BOXCAR_CONFIG": cfgPath}, "status", id)
	if err != nil || !strings.Contains(out, "queued") {
		t.Fatalf("submit status with BOXCAR_CONFIG: %v\n%s%s", err, out, stderr)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for name := range js.StreamNames(t.Context()).Name() {
		if strings.HasPrefix(name, "BOXCAR_") || strings.HasPrefix(name, "KV_BOXCAR_STATUS") {
			t.Errorf("stream %s exists: submit made or used a default name", name)
		}
	}
	if _, stderr, err := submit(map[string]string{"NATS_URL": ns.ClientURL()}, "status", id); err == nil || !strings.Contains(err.Error(), "queue not set up") {
		t.Errorf("submit status without the config: %v\n%s\nwant it to say the queue (under the default names) is not set up", err, stderr)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("nats: {stream: a.b}\nprofiles:\n  p:\n    model: {name: m}\n    tools: [{name: read_file}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := submit(map[string]string{}, "status", id, "--config", bad); err == nil || !strings.Contains(err.Error(), "--config: the workers' config: "+bad+":1:16 nats.stream") {
		t.Errorf("submit with a bad --config: %v; want it to name the flag, the file, the line and the key", err)
	}
}
