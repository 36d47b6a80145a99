package workercmd_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
	"github.com/boxcar-run/boxcar/internal/workercmd"
)

// TestSetupDeclaresFromTheConfig: `worker setup --config FILE` declares one consumer per
// tenant of the file, with the tenant's max_concurrent as its max_ack_pending, and its job
// stream bounded by its max_queued and max_queued_bytes (or the nats ones), and the buckets,
// and says so; a second run changes nothing and succeeds.
// jetStreamOf connects to the server at url for the test's look at what setup declared, and a
// context for its calls.
func jetStreamOf(t *testing.T, url string) (jetstream.JetStream, context.Context) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return js, ctx
}

func TestSetupDeclaresFromTheConfig(t *testing.T) {
	t.Parallel()
	ns := queuetest.Start(t, queue.EmbeddedOptions{})
	getenv := func(k string) string {
		if k == "NATS_URL" {
			return ns.ClientURL()
		}
		return ""
	}
	for range 2 {
		var stdout, stderr bytes.Buffer
		if err := workercmd.Run(t.Context(), []string{"setup", "--config", "testdata/check-config/13-ok-tenants.yaml"}, getenv, &stdout, &stderr); err != nil {
			t.Fatalf("setup: %v\n%s", err, stderr.String())
		}
		for _, want := range []string{
			"tenant team-a: stream BOXCAR_JOBS_team-a (queue at most 500 jobs (tenants.team-a.max_queued), at most 8388608 bytes (tenants.team-a.max_queued_bytes)), consumer boxcar-workers-team-a, max_concurrent 4, status bucket BOXCAR_STATUS_team-a, approvals bucket BOXCAR_APPROVALS_team-a, cancel bucket BOXCAR_CANCEL_team-a, dead letters BOXCAR_DLQ_team-a, usage bucket BOXCAR_USAGE_team-a",
			"tenant team-b: stream BOXCAR_JOBS_team-b (queue at most 100000 jobs (nats.job_max_msgs), at most 1073741824 bytes (nats.job_max_bytes)), consumer boxcar-workers-team-b, max_concurrent 16, status bucket BOXCAR_STATUS_team-b, approvals bucket BOXCAR_APPROVALS_team-b, cancel bucket BOXCAR_CANCEL_team-b, dead letters BOXCAR_DLQ_team-b, usage bucket BOXCAR_USAGE_team-b",
			"declared a job stream, a status bucket, an approvals bucket, a cancel bucket, a dead-letter stream and a usage bucket per tenant, the shared stream BOXCAR_JOBS",
		} {
			if !strings.Contains(stdout.String(), want) {
				t.Errorf("setup says\n%s\nwant a line with %q", stdout.String(), want)
			}
		}
	}
	js, ctx := jetStreamOf(t, ns.ClientURL())
	for tenant, want := range map[string]int{"team-a": 4, "team-b": 16} {
		name := "boxcar-workers-" + tenant
		c, err := js.Consumer(ctx, "BOXCAR_JOBS_"+tenant, name)
		if err != nil {
			t.Fatalf("consumer %s: %v", name, err)
		}
		if got := c.CachedInfo().Config.MaxAckPending; got != want {
			t.Errorf("%s: max_ack_pending %d, want %d", name, got, want)
		}
	}
	for tenant, want := range map[string][2]int64{"team-a": {500, 8 << 20}, "team-b": {100000, 1 << 30}} {
		s, err := js.Stream(ctx, "BOXCAR_JOBS_"+tenant)
		if err != nil {
			t.Fatal(err)
		}
		if c := s.CachedInfo().Config; c.MaxMsgs != want[0] || c.MaxBytes != want[1] {
			t.Errorf("%s's job stream holds at most %d jobs, %d bytes; want %d, %d", tenant, c.MaxMsgs, c.MaxBytes, want[0], want[1])
		}
	}
	for _, b := range []string{"BOXCAR_CANCEL_team-a", "BOXCAR_CANCEL_team-b"} {
		// A cancel request is written with no expiry (Nats-TTL: never), which needs a TTL per key.
		if s, err := js.Stream(ctx, "KV_"+b); err != nil || !s.CachedInfo().Config.AllowMsgTTL {
			t.Errorf("cancel bucket %s allows no TTL per request: %v", b, err)
		}
	}
	for _, b := range []string{"BOXCAR_STATUS_team-a", "BOXCAR_STATUS_team-b", "BOXCAR_APPROVALS_team-a", "BOXCAR_APPROVALS_team-b", queue.ProfilesBucket, "BOXCAR_USAGE_team-a", "BOXCAR_USAGE_team-b"} {
		if _, err := js.KeyValue(ctx, b); err != nil {
			t.Errorf("bucket %s: %v", b, err)
		}
	}
	for _, s := range []string{"BOXCAR_JOBS_default", "KV_BOXCAR_STATUS_default", "KV_BOXCAR_STATUS", "KV_BOXCAR_APPROVALS", "KV_BOXCAR_USAGE_default", "KV_BOXCAR_USAGE", "KV_BOXCAR_CANCEL_default", "KV_BOXCAR_CANCEL"} {
		if _, err := js.Stream(ctx, s); err == nil {
			t.Errorf("setup declared %s, which the config names no tenant of and no older Boxcar made", s)
		}
	}
}

// TestCheckConfigSaysTheQueueBoundsSetupApplies: `worker check-config` prints each tenant's
// queue bounds with the setting each comes from, as `worker setup` prints those it applies, so
// an operator reads what setup will do before running it.
func TestCheckConfigSaysTheQueueBoundsSetupApplies(t *testing.T) {
	t.Parallel()
	ns := queuetest.Start(t, queue.EmbeddedOptions{})
	getenv := func(k string) string { return map[string]string{"NATS_URL": ns.ClientURL()}[k] }
	const file = "testdata/check-config/13-ok-tenants.yaml"
	bounds := []string{
		"queue at most 500 jobs (tenants.team-a.max_queued), at most 8388608 bytes (tenants.team-a.max_queued_bytes)",
		"queue at most 100000 jobs (nats.job_max_msgs), at most 1073741824 bytes (nats.job_max_bytes)",
	}
	for _, args := range [][]string{{"check-config", file}, {"setup", "--config", file}} {
		var stdout, stderr bytes.Buffer
		if err := workercmd.Run(t.Context(), args, getenv, &stdout, &stderr); err != nil {
			t.Fatalf("%s: %v\n%s", args[0], err, stderr.String())
		}
		for _, want := range bounds {
			if !strings.Contains(stdout.String(), want) {
				t.Errorf("%s says\n%s\nwant a line with %q", args[0], stdout.String(), want)
			}
		}
	}
}

// TestSetupTakesATenantAddedLater: the operator's upgrade that adds a tenant and changes
// another's max_concurrent runs `worker setup` again (the chart's pre-upgrade hook): the new
// tenant gets its job stream, consumer and buckets, the changed tenant's consumer takes its new
// bound, and nothing of the first tenant's is lost (a job queued before stays queued).
func TestSetupTakesATenantAddedLater(t *testing.T) {
	t.Parallel()
	ns := queuetest.Start(t, queue.EmbeddedOptions{})
	getenv := func(k string) string { return map[string]string{"NATS_URL": ns.ClientURL()}[k] }
	const head = "store: {url: \"s3://boxcar/runs\"}\nprofiles:\n  p:\n    model: {name: gpt-4.1-mini}\n    tools: [{name: read_file}]\ntenants:\n"
	dir := t.TempDir()
	setup := func(tenants string) {
		t.Helper()
		file := filepath.Join(dir, "boxcar.yaml")
		if err := os.WriteFile(file, []byte(head+tenants), 0o600); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		if err := workercmd.Run(t.Context(), []string{"setup", "--config", file}, getenv, &stdout, &stderr); err != nil {
			t.Fatalf("setup: %v\n%s", err, stderr.String())
		}
	}
	setup("  team-a: {profiles: [p], max_concurrent: 4}\n")
	js, ctx := jetStreamOf(t, ns.ClientURL())
	if _, err := js.Publish(ctx, "boxcar.jobs.team-a.j1", []byte(`{}`)); err != nil {
		t.Fatalf("queue a job of team-a: %v", err)
	}
	setup("  team-a: {profiles: [p], max_concurrent: 8}\n  team-b: {profiles: [p], max_concurrent: 2}\n")
	for tenant, want := range map[string]int{"team-a": 8, "team-b": 2} {
		c, err := js.Consumer(ctx, "BOXCAR_JOBS_"+tenant, "boxcar-workers-"+tenant)
		if err != nil {
			t.Fatalf("%s's consumer after the second setup: %v", tenant, err)
		}
		if got := c.CachedInfo().Config.MaxAckPending; got != want {
			t.Errorf("%s's consumer: max_ack_pending %d, want %d", tenant, got, want)
		}
	}
	for _, b := range []string{"BOXCAR_STATUS_team-b", "BOXCAR_APPROVALS_team-b", "BOXCAR_CANCEL_team-b", "BOXCAR_USAGE_team-b"} {
		if _, err := js.KeyValue(ctx, b); err != nil {
			t.Errorf("bucket %s of the added tenant: %v", b, err)
		}
	}
	if _, err := js.Stream(ctx, "BOXCAR_DLQ_team-b"); err != nil {
		t.Errorf("dead-letter stream of the added tenant: %v", err)
	}
	s, err := js.Stream(ctx, "BOXCAR_JOBS_team-a")
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("team-a's job stream holds %d jobs after the second setup, want the 1 queued before", n)
	}
}

// TestSetupSaysWhereItLookedForNATS: a `worker setup` that reaches no NATS server says the
// address came from the config's nats.url or NATS_URL, its only two sources; it said "set
// --nats / NATS_URL", a flag setup does not have, and "start one with `worker --embedded`",
// which an operator declaring a cluster's queue has no use for.
func TestSetupSaysWhereItLookedForNATS(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() { // a server that hangs up at once: no NATS answers there
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	addr := l.Addr().String()
	getenv := func(k string) string { return map[string]string{"NATS_URL": "nats://" + addr}[k] }
	var stdout, stderr bytes.Buffer
	err = workercmd.Run(t.Context(), []string{"setup", "--config", "testdata/check-config/13-ok-tenants.yaml"}, getenv, &stdout, &stderr)
	if err == nil {
		t.Fatal("setup with no NATS server succeeded")
	}
	for _, want := range []string{addr, "nats.url", "NATS_URL"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("setup's error %q does not name %s", err, want)
		}
	}
	for _, wrong := range []string{"--nats ", "worker --embedded"} {
		if strings.Contains(err.Error(), wrong) {
			t.Errorf("setup's error %q says %q, which setup has no use for", err, wrong)
		}
	}
}
