package workercmd

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/natsauthtest"
	testharness "github.com/boxcar-run/boxcar/test/harness"
)

// TestReadyzNotReadyWhileItsConsumerIsGone: a worker whose NATS identity may not declare binds
// to what `worker setup` declared. When its tenant's consumer is removed while it runs (a NATS
// that lost its data, an operator's mistake), it can fetch no job until setup runs again: its
// log says so, and /readyz answers 503 naming the consumer, with no address or credential.
func TestReadyzNotReadyWhileItsConsumerIsGone(t *testing.T) {
	t.Parallel()
	// What `worker nats-config` denies a worker: declaring streams and the jobs' durable
	// consumers (its KV watches' ephemeral consumers it may create).
	declare := []string{"$JS.API.STREAM.CREATE.>", "$JS.API.STREAM.UPDATE.>", "$JS.API.STREAM.DELETE.>",
		"$JS.API.CONSUMER.CREATE.BOXCAR_JOBS.>", "$JS.API.CONSUMER.CREATE.BOXCAR_JOBS_default.>", "$JS.API.CONSUMER.DURABLE.CREATE.>",
		"$JS.API.CONSUMER.DELETE.BOXCAR_JOBS.>", "$JS.API.CONSUMER.DELETE.BOXCAR_JOBS_default.>"}
	ns := natsauthtest.Start(t, natsauthtest.Server{
		JetStream: true,
		Users:     map[string]string{"operator": "op-pw", "worker": "w-pw"},
		Perms:     map[string]*server.Permissions{"worker": {Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: declare}}},
	})
	dir := t.TempDir()
	yaml := "nats: {url: \"" + ns.ClientURL() + "\"}\n" +
		"store: {url: \"file://" + filepath.Join(dir, "store") + "\"}\n" +
		"model: {base_url: \"http://127.0.0.1:1/v1\"}\n" +
		"profiles:\n  p:\n    model: {name: m}\n    tools: [{name: read_file}]\n"
	cfgPath := filepath.Join(dir, "boxcar.yaml")
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	op, err := queue.Connect(ctx, queue.ConnOptions{URL: ns.ClientURL(), User: "operator", Password: "op-pw", Name: "operator"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(op.Close)
	admin, err := queue.NewAdmin(op, cfg.NATS, cfg.Tenants, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Declare(ctx); err != nil {
		t.Fatal(err)
	}

	var logs testharness.LogBuffer
	env := map[string]string{"NATS_USER": "worker", "NATS_PASSWORD": "w-pw"}
	w, err := Start(ctx, Options{ConfigPath: cfgPath, DataDir: dir, MetricsAddr: "127.0.0.1:0",
		Getenv: func(k string) string { return env[k] }, Stderr: &logs})
	if err != nil {
		t.Fatal(err)
	}
	waitReady(t, w)
	readyz := func() (int, string) {
		resp, err := http.Get("http://" + w.Addrs().Metrics + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 4096)
		n, _ := resp.Body.Read(buf)
		b.Write(buf[:n])
		return resp.StatusCode, b.String()
	}
	if code, body := readyz(); code != http.StatusOK {
		t.Fatalf("/readyz of the started worker: %d %s", code, body)
	}

	js, err := jetstream.New(op)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteConsumer(ctx, queue.JobStream(cfg.NATS, job.DefaultTenant), cfg.NATS.Consumer+"-"+job.DefaultTenant); err != nil {
		t.Fatal(err)
	}
	testharness.Wait(t, "the worker to notice its consumer is gone", func() (bool, error) {
		return strings.Contains(logs.String(), "is gone from NATS"), nil
	}, testharness.Within(45*time.Second))
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "is gone from NATS") {
			t.Logf("the worker's log: %s", l)
			break
		}
	}
	code, body := readyz()
	if code != http.StatusServiceUnavailable || !strings.Contains(body, cfg.NATS.Consumer+"-"+job.DefaultTenant) {
		t.Errorf("/readyz = %d %q while the worker can fetch no job (its consumer is gone, and it may not declare one); want 503 naming it", code, body)
	}
	if host := strings.TrimPrefix(ns.ClientURL(), "nats://"); strings.Contains(body, host) || strings.Contains(body, "w-pw") {
		t.Errorf("/readyz names NATS's address or the worker's password: %q", body)
	}
}
