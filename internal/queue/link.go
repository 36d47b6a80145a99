package queue

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/boxcar-run/boxcar/internal/backoff"
)

// Link is a worker's connection to NATS. Unlike Connect it never gives up: when no server
// answers at start it keeps dialling in the background, after losing the server it redials
// with backoff, and it logs once each time the connection goes down or comes back (each retry
// only at debug level), so a NATS restart during a rollout is a wait, not a crash loop.
type Link struct {
	nc  *nats.Conn
	url string // redacted: it goes into logs and /readyz
	log *slog.Logger

	mu      sync.Mutex
	down    bool  // a failure was logged and no connection has been made since
	closing bool  // Close was called: losing the connection is no news
	lastErr error // why the last dial failed
}

// Dial returns a link to NATS at once, connected or not. It fails only on options it cannot
// use (a bad URL, two ways to log in, a file that cannot be read).
func Dial(o ConnOptions, log *slog.Logger) (*Link, error) {
	l := &Link{url: RedactURL(o.URL), log: log}
	opts, err := o.natsOptions()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(o.URL, append(opts,
		nats.RetryOnFailedConnect(true),
		nats.CustomReconnectDelay(backoff.Delay), // between two rounds of dialling every server
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) { l.failed(err) }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { l.lost(err) }),
		nats.ConnectHandler(func(*nats.Conn) { l.connected() }),
		nats.ReconnectHandler(func(*nats.Conn) { l.connected() }),
	)...)
	if err != nil {
		return nil, fmt.Errorf("queue: NATS at %s: %w (check NATS_URL or nats.url in the config)", l.url, err)
	}
	l.mu.Lock()
	l.nc = nc
	l.mu.Unlock()
	return l, nil
}

// Conn is the connection; it is usable at once, and requests wait while it is down.
func (l *Link) Conn() *nats.Conn { return l.nc }

// Close closes the connection.
func (l *Link) Close() {
	l.mu.Lock()
	l.closing = true
	l.mu.Unlock()
	l.nc.Close()
}

// Err is nil while the link is connected, else why not: what /readyz shows.
func (l *Link) Err() error {
	if l.nc.IsConnected() {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	msg := fmt.Sprintf("not connected to %s (%s)", l.url, l.nc.Status())
	if l.lastErr != nil {
		return fmt.Errorf("%s: %w", msg, l.lastErr)
	}
	return errors.New(msg)
}

func (l *Link) failed(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// "No servers available" sums up a round of dials; keep the dial's own error, which says
	// what is wrong (refused, no route, TLS).
	if !errors.Is(err, nats.ErrNoServers) || l.lastErr == nil {
		l.lastErr = err
	}
	if l.closing {
		return // a dial that failed as the link closed: nothing to say, and the log may be gone
	}
	if l.down {
		l.log.Debug("NATS still not reachable; dialling again", "url", l.url, "error", err)
		return
	}
	l.down = true
	l.log.Warn("NATS not reachable; waiting for it (retrying with backoff, up to every "+backoff.Max.String()+")", "url", l.url, "error", err)
}

func (l *Link) lost(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.lastErr = err
	}
	if l.down || l.closing {
		return // already said so, or closed on purpose
	}
	l.down = true
	l.log.Warn("lost the connection to NATS; reconnecting", "url", l.url, "error", err)
}

func (l *Link) connected() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastErr = nil
	if l.down {
		l.log.Info("connected to NATS", "url", l.url)
	}
	l.down = false
}
