package workercmd_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/workercmd"
)

// TestSetupHintSaysWhatFailed: a failed setup's hint says what to do about what failed. An
// identity NATS refuses $JS.API (the refusal shows on the connection; the requests only time
// out) is told to run setup as the operator; an identity that may, whose requests JetStream
// did not answer within the budget, is told to look at JetStream, not at its rights. The
// refusal is permanent: setup fails at it, where it waited out its budget (a minute) for the
// replies that never come.
func TestSetupHintSaysWhatFailed(t *testing.T) {
	t.Parallel()
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true,
		JetStreamMaxStore: 1 << 40,
		Users: []*server.User{
			{Username: "operator", Password: "op-pw"},
			{Username: "worker", Password: "wk-pw", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.API.>"}},
			}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	for _, tc := range []struct {
		name, user, password string
		budget               time.Duration
		want, notWant        string
	}{
		{name: "refused on the connection", user: "worker", password: "wk-pw", budget: 30 * time.Second,
			want: "NATS refused its requests on $JS.API: run setup as the operator", notWant: "answered none"},
		{name: "deadline, no refusal", user: "operator", password: "op-pw", budget: time.Nanosecond,
			want: "NATS answered none of setup's requests within 1ns: is JetStream up and its meta leader elected (`nats server report jetstream`)? run setup again", notWant: "operator"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"NATS_URL": ns.ClientURL(), "NATS_USER": tc.user, "NATS_PASSWORD": tc.password}
			var stdout, stderr bytes.Buffer
			err := workercmd.SetupWithin(t.Context(), tc.budget, "testdata/check-config/13-ok-tenants.yaml", func(k string) string { return env[k] }, &stdout, &stderr)
			if err == nil {
				t.Fatalf("setup succeeded; want it to fail with %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), tc.notWant) {
				t.Fatalf("setup: %v\nwant it to say %q and not %q", err, tc.want, tc.notWant)
			}
			if tc.user == "worker" && (!errors.Is(err, queue.ErrRefused) || errors.Is(err, context.DeadlineExceeded)) {
				t.Errorf("setup refused: %v; want ErrRefused at the refusal, not its budget waited out", err)
			}
		})
	}
}
