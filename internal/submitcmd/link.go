package submitcmd

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/boxcar-run/boxcar/internal/queue"
)

// natsLink says on stderr when submit's NATS connection is lost and when it answers again. A
// command that follows a job reads nothing while the connection is lost; without a word it
// showed the last status as if the job had stalled, for up to its --timeout. The job is not
// lost with the connection: workers run it on without submit, and the connection is dialled
// again every second.
type natsLink struct {
	mu     sync.Mutex
	w      io.Writer
	url    string // redacted: never a password or token
	again  string // the command that follows the job again, once one is followed
	inView bool   // a terminal's block shows the notice instead of a line
	lostAt time.Time
	err    error
}

// watchLink makes e.link report the losses and returns of nc, which reaches url.
func (e *env) watchLink(nc *nats.Conn, url string) {
	l := &natsLink{w: e.stderr, url: queue.RedactURL(url)}
	e.link = l
	nc.SetDisconnectErrHandler(func(c *nats.Conn, err error) {
		if err != nil && !c.IsClosed() { // Close says nil: the command is done
			l.lost(err)
		}
	})
	nc.SetReconnectHandler(func(*nats.Conn) { l.back() })
}

// following sets the command that follows the job again, which the notice names.
func (l *natsLink) following(again string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.again = again
}

// inBlock makes a terminal's block show the notice (notice), where a line of its own would be
// drawn over.
func (l *natsLink) inBlock() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inView = true
}

func (l *natsLink) lost(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lostAt, l.err = time.Now(), err
	if !l.inView {
		fmt.Fprintf(l.w, "submit: %s\n", l.noticeLocked())
	}
}

func (l *natsLink) back() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostAt.IsZero() {
		return
	}
	if !l.inView {
		fmt.Fprintf(l.w, "submit: NATS at %s answered again after %s\n", l.url, time.Since(l.lostAt).Round(100*time.Millisecond))
	}
	l.lostAt, l.err = time.Time{}, nil
}

// notice is the line a terminal's block shows while the connection is lost, short enough not
// to wrap (Ctrl-C says how to follow the job again); empty while it is not lost.
func (l *natsLink) notice() string {
	if l == nil {
		return ""
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostAt.IsZero() {
		return ""
	}
	return l.lostLocked() + "; the job runs on"
}

func (l *natsLink) lostLocked() string {
	return fmt.Sprintf("lost NATS at %s at %s (%v); reconnecting every second", l.url, l.lostAt.Format(time.TimeOnly), l.err)
}

func (l *natsLink) noticeLocked() string {
	if l.again == "" {
		return l.lostLocked() + "; nothing submitted is lost"
	}
	return l.lostLocked() + fmt.Sprintf(". The job is not lost: workers run it on without submit; Ctrl-C and follow it again later with `%s`", l.again)
}
