package egress

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"time"
)

// errByteCap ends a transfer at Limits.MaxBytes, or refuses what would not fit under it.
var errByteCap = errors.New("egress: the job's byte cap is reached")

// errRequestCap refuses a request's replay (upstream.go) past the job's request cap.
var errRequestCap = errors.New("egress: the job's request cap is reached")

// meter counts one direction's bytes for a decision and takes them from the job's cap before
// they move: a write or a read is cut to what is left under the cap, so once the job's total
// reaches it not one more byte goes through (a check after the write let each write through
// whole: up to a buffer's worth past the cap on every request).
type meter struct {
	n   atomic.Int64
	job *atomic.Int64
	cap int64
}

// take reserves up to want bytes of what is left under the job's cap and returns how many;
// settle then gives back what was not used.
func (m *meter) take(want int) int {
	for {
		used := m.job.Load()
		n := min(int64(want), max(m.cap-used, 0))
		if n == 0 || m.job.CompareAndSwap(used, used+n) {
			return int(n)
		}
	}
}

// settle counts used of the taken bytes for the decision and gives the rest back to the job.
func (m *meter) settle(taken, used int) {
	m.n.Add(int64(used))
	m.job.Add(int64(used - taken))
}

// takeAll takes n bytes or none: what cannot be sent in part (a request header the Transport
// writes whole) is sent only when it fits.
func (m *meter) takeAll(n int) error {
	if got := m.take(n); got < n {
		m.settle(got, 0)
		return errByteCap
	}
	m.settle(n, n)
	return nil
}

// capReached is the refusal of a request once the job is at its byte cap.
var capReached = verdict{ReasonByteCap, "the job's byte cap is reached"}

// capReserve is kept back from Limits.MaxBytes for the answer that says the job is at its cap,
// so that the first request past it reads why, and the answer still moves no byte past the
// cap; every byte_cap answer after it finds no room and is not sent.
var capReserve = int64(len(refusal(&capReached)))

// dataCap is the job's byte cap for all but its byte_cap answers: Limits.MaxBytes less
// capReserve.
func (p *Proxy) dataCap() int64 { return max(p.cfg.Limits.MaxBytes-capReserve, 0) }

// meter starts one direction's count for a decision, under the job's byte cap.
func (p *Proxy) meter() *meter { return &meter{job: &p.bytes, cap: p.dataCap()} }

// answerMeter counts the proxy's answer v: a byte_cap one may take the reserve.
func (p *Proxy) answerMeter(v *verdict) *meter {
	m := p.meter()
	if v.reason == ReasonByteCap {
		m.cap = p.cfg.Limits.MaxBytes
	}
	return m
}

// writeWhole writes s, which the proxy says itself (a 100 Continue, a CONNECT's 200, a
// refusal), when all of it fits under the job's byte cap, counting it; else nothing.
func (m *meter) writeWhole(w io.Writer, s string) error {
	if err := m.takeAll(len(s)); err != nil {
		return err
	}
	_, err := io.WriteString(w, s)
	return err
}

// meteredWriter writes what fits under the job's byte cap and fails once it cuts a write.
type meteredWriter struct {
	w io.Writer
	m *meter
}

func (w meteredWriter) Write(b []byte) (int, error) {
	k := w.m.take(len(b))
	var n int
	var err error
	if k > 0 {
		n, err = w.w.Write(b[:k])
	}
	w.m.settle(k, n)
	if err == nil && k < len(b) {
		err = errByteCap
	}
	return n, err
}

// idleConn pushes its deadlines forward on every read and write, so a connection ends after
// Limits.IdleTimeout with no traffic either way however long it lives. While hard is set (a
// request header or a ClientHello is awaited) reads end by hard at the latest.
//
// A write moves the read deadline too: a connection's two directions are often served by two
// goroutines (a spliced tunnel's two copies; the Transport's read loop waiting for an answer
// while a long upload is written), and a read blocked while bytes flow the other way timed
// out after IdleTimeout: a download the client sent nothing more to was cut mid-stream.
type idleConn struct {
	net.Conn
	idle  time.Duration
	hard  time.Time
	wrote atomic.Bool // a byte was written since the request began (survive)
}

func (c *idleConn) Read(b []byte) (int, error) {
	_ = c.SetReadDeadline(c.readDeadline())
	return c.Conn.Read(b)
}

func (c *idleConn) Write(b []byte) (int, error) {
	_ = c.SetWriteDeadline(time.Now().Add(c.idle))
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.wrote.Store(true)
		_ = c.SetReadDeadline(c.readDeadline())
	}
	return n, err
}

// readDeadline is IdleTimeout from now, or hard when that comes first.
func (c *idleConn) readDeadline() time.Time {
	d := time.Now().Add(c.idle)
	if !c.hard.IsZero() && c.hard.Before(d) {
		d = c.hard
	}
	return d
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
	if cw, ok := bare(c).(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}

// bare is the connection under the proxy's wrappers of c.
func bare(c net.Conn) net.Conn {
	for {
		switch w := c.(type) {
		case *idleConn:
			c = w.Conn
		case prefixConn:
			c = w.Conn
		case sandboxConn:
			c = w.Conn
		default:
			return c
		}
	}
}

// Bounds of lingerClose: a refused request's body the sandbox goes on sending after the
// answer is read and dropped up to maxLingerBytes (SES's SendRawEmail takes 10 MB), for at
// most lingerTimeout, and only while the job's byte cap has room: each byte read is taken
// from it as it is read, in no decision (one per linger would be one more the sandbox makes at
// will) but in the job's summary (Summary.Lingered). Uncounted, a job's lingers read 16 MiB
// for each of its requests, far past max_bytes (TestLingerIsBoundedByTheByteCap).
const (
	maxLingerBytes = 16 << 20
	lingerTimeout  = 10 * time.Second
)

// lingerClose ends a connection on which the proxy answered a refusal, maybe before reading
// the request's body: it half-closes it, then reads and drops what the sandbox still sends,
// to its end or lingerClose's bounds. Closed with bytes unread, the connection was reset, and
// the sandbox's client, still writing the body, read the reset (or a broken pipe) where the
// answer was (TestFormOverrideEarlyIsAnswered). The caller closes c.
func (p *Proxy) lingerClose(c net.Conn) {
	closeWrite(c)
	c = bare(c)
	_ = c.SetReadDeadline(time.Now().Add(lingerTimeout))
	buf := make([]byte, 32<<10)
	for left := maxLingerBytes; left > 0; {
		// Taken once read, not held while the sandbox is waited for (TestUploadCutAfterAnswer):
		// lingers side by side may read a buffer each past the cap, and stop.
		k := int(min(int64(min(len(buf), left)), p.dataCap()-p.bytes.Load()))
		if k <= 0 {
			return
		}
		n, err := c.Read(buf[:k])
		m := p.meter()
		got := m.take(n)
		m.settle(got, got)
		p.ledger.lingered(int64(got))
		if err != nil || got < n {
			return
		}
		left -= n
	}
}

// lingerTLS is lingerClose for a terminated tunnel: its close_notify follows the answer.
func (p *Proxy) lingerTLS(tc *tls.Conn) {
	_ = tc.CloseWrite()
	p.lingerClose(tc.NetConn())
}
