package egress

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"time"
)

// errByteCap ends a connection that went over Limits.MaxBytes.
var errByteCap = errors.New("egress: the job's byte cap is reached")

// meter counts one direction's bytes for a decision and the job's cap.
type meter struct {
	n   atomic.Int64
	job *atomic.Int64
	cap int64
}

func (m *meter) add(n int) error {
	m.n.Add(int64(n))
	if m.job.Add(int64(n)) > m.cap {
		return errByteCap
	}
	return nil
}

// meteredWriter counts what it writes; it fails once the job is over its byte cap.
type meteredWriter struct {
	w io.Writer
	m *meter
}

func (w meteredWriter) Write(b []byte) (int, error) {
	n, err := w.w.Write(b)
	if cerr := w.m.add(n); cerr != nil && err == nil {
		err = cerr
	}
	return n, err
}

// idleConn pushes its deadline forward on every read and write, so a connection ends after
// Limits.IdleTimeout with no traffic however long it lives. While hard is set (a request
// header or a ClientHello is awaited) reads end by hard at the latest.
type idleConn struct {
	net.Conn
	idle time.Duration
	hard time.Time
}

func (c *idleConn) Read(b []byte) (int, error) {
	d := time.Now().Add(c.idle)
	if !c.hard.IsZero() && c.hard.Before(d) {
		d = c.hard
	}
	_ = c.SetReadDeadline(d)
	return c.Conn.Read(b)
}

func (c *idleConn) Write(b []byte) (int, error) {
	_ = c.SetWriteDeadline(time.Now().Add(c.idle))
	return c.Conn.Write(b)
}

// prefixConn reads r (bytes already taken from the connection, then the connection) and writes
// to the connection.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (c prefixConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// closeWrite half-closes c when it can, so the other side sees EOF and can still answer.
func closeWrite(c net.Conn) {
	switch w := c.(type) {
	case *idleConn:
		closeWrite(w.Conn)
		return
	case prefixConn:
		closeWrite(w.Conn)
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}
