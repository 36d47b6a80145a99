package queue

import (
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// EmbeddedOptions configure an in-process nats-server for single-machine use and tests.
type EmbeddedOptions struct {
	// Host and Port to listen on. Default host 127.0.0.1; Port -1 picks a free port.
	Host string
	Port int
	// StoreDir holds JetStream's files.
	StoreDir string
	// SyncAlways fsyncs every write, for tests that prove nothing is lost.
	SyncAlways bool
	// Token, when set, is the token every client must present (ConnOptions.Token).
	Token string
	// MaxStore, when set, is the most JetStream may store, whatever the disk's free space;
	// unset, nats-server takes three quarters of the free space when it starts. Every stream
	// reserves its max_bytes against it, so tests set one (1 << 40, nats-server's default for
	// a limit) to declare the same streams on a machine whatever its free disk.
	MaxStore int64
}

// StartEmbedded starts the real nats-server in this process with JetStream on file storage and
// waits until it accepts connections.
func StartEmbedded(opts EmbeddedOptions) (*server.Server, error) {
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	sopts := &server.Options{
		ServerName:    "boxcar-embedded",
		Host:          opts.Host,
		Port:          opts.Port,
		JetStream:     true,
		StoreDir:      opts.StoreDir,
		NoSigs:        true,
		NoLog:         true,
		MaxPayload:    1 << 20,
		Authorization: opts.Token,
		// 0 leaves nats-server's own limit, from the disk's free space.
		JetStreamMaxStore: opts.MaxStore,
	}
	if opts.SyncAlways {
		sopts.SyncAlways = true
	}
	ns, err := server.NewServer(sopts)
	if err != nil {
		return nil, fmt.Errorf("queue: embedded nats-server: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("queue: embedded nats-server did not start on %s:%d within 10s (is the port taken? another worker may be running)", opts.Host, opts.Port)
	}
	return ns, nil
}
