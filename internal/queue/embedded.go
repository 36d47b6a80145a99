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
