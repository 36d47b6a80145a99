// Package queuetest starts the real nats-server in a test's process, as the tests of every
// package that needs NATS do, with one storage limit for all of them. Tests only: it fails the
// test it is given.
package queuetest

import (
	"context"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/boxcar-run/boxcar/internal/queue"
)

// MaxStore is the JetStream storage limit of a test's server (nats-server's default for a
// limit): every stream reserves its max_bytes against it, 2.4 GiB a tenant by default, so a
// test declares the same streams whatever the machine's free disk, of which nats-server
// otherwise takes three quarters.
const MaxStore = 1 << 40

// Start starts the real nats-server in this process (queue.StartEmbedded) and shuts it down
// when tb ends; calling its Shutdown before, to stop NATS during the test, is fine. Unset in
// opts: MaxStore is MaxStore, Port picks a free port (read it back from the server), StoreDir
// is a directory of tb's.
func Start(tb testing.TB, opts queue.EmbeddedOptions) *server.Server {
	tb.Helper()
	if opts.MaxStore == 0 {
		opts.MaxStore = MaxStore
	}
	if opts.Port == 0 {
		opts.Port = -1
	}
	if opts.StoreDir == "" {
		opts.StoreDir = tb.TempDir()
	}
	ns, err := queue.StartEmbedded(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

// Connect is Start, and a connection to the server (queue.Connect) closed when tb ends.
func Connect(tb testing.TB, opts queue.EmbeddedOptions) (*server.Server, *nats.Conn) {
	tb.Helper()
	ns := Start(tb, opts)
	nc, err := queue.Connect(context.Background(), queue.ConnOptions{URL: ns.ClientURL(), Name: "test", Token: opts.Token})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	return ns, nc
}
