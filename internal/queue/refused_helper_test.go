package queue_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
)

// serverDenyingWorker starts a nats-server with JetStream and two logins: "op", which may do
// anything, and "worker", whose publishes on deny the server refuses (a login generated without
// some grant), and returns how to connect as either. Such a refusal shows on the connection
// alone: a request refused waits for an answer that never comes.
func serverDenyingWorker(t *testing.T, deny ...string) (conn func(login string) *nats.Conn) {
	t.Helper()
	opts := &server.Options{ServerName: "boxcar-denying", Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true,
		JetStream: true, StoreDir: t.TempDir(), JetStreamMaxStore: queuetest.MaxStore,
		Users: []*server.User{{Username: "op", Password: "op-pw"}, {Username: "worker", Password: "worker-pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: deny}}}}}
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(20 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	return func(login string) *nats.Conn {
		nc, err := queue.Connect(t.Context(), queue.ConnOptions{URL: ns.ClientURL(), Name: "test-" + login, User: login, Password: login + "-pw"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
}
