package submitcmd

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// ackDropper is a TCP proxy between submit and nats-server. Once the job's publish has gone
// through to the server, it drops everything the server sends back, so the server stores the
// job and the client never hears so: the ack lost in a server restart.
type ackDropper struct {
	ln      net.Listener
	target  string
	marker  []byte
	seen    chan struct{}
	once    sync.Once
	mu      sync.Mutex
	armed   bool // the next job publish starts dropping
	drop    bool
	conns   []net.Conn
	closing bool
}

func newAckDropper(t *testing.T, target, subject string) *ackDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &ackDropper{ln: ln, target: target, marker: []byte("HPUB " + subject), seen: make(chan struct{}), armed: true}
	t.Cleanup(func() {
		p.mu.Lock()
		p.closing = true
		p.mu.Unlock()
		ln.Close()
		p.reset()
	})
	go p.serve()
	return p
}

// arm makes the next job publish start dropping again.
func (p *ackDropper) arm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = true
}

func (p *ackDropper) url() string { return "nats://" + p.ln.Addr().String() }

func (p *ackDropper) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		if p.closing {
			p.mu.Unlock()
			client.Close()
			server.Close()
			return
		}
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		go p.pipe(server, client, true)
		go p.pipe(client, server, false)
	}
}

// pipe copies src to dst. From the client it watches for the job's publish; from the server it
// forwards nothing once that publish went by.
func (p *ackDropper) pipe(dst, src net.Conn, fromClient bool) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	var tail []byte // the end of the previous read, for a marker split across two reads
	for {
		n, err := src.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if fromClient {
				// Drop first, forward then: the ack must not slip through in between.
				p.mu.Lock()
				seen := p.armed && bytes.Contains(append(tail, chunk...), p.marker)
				if seen {
					p.drop = true
				}
				p.mu.Unlock()
				if _, err := dst.Write(chunk); err != nil {
					return
				}
				if seen {
					p.once.Do(func() { close(p.seen) })
				}
				tail = append(tail[:0], chunk[max(0, n-len(p.marker)):]...)
			} else {
				p.mu.Lock()
				drop := p.drop
				p.mu.Unlock()
				if !drop {
					if _, err := dst.Write(chunk); err != nil {
						return
					}
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// reset closes every connection and forwards everything from now on: clients reconnect
// through it.
func (p *ackDropper) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drop, p.armed = false, false
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// submitVia runs submit with a short publish policy, against NATS at url.
func (te *testEnv) submitVia(t *testing.T, policy publishPolicy, url string, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	e := &env{getenv: func(k string) string {
		return map[string]string{"NATS_URL": url, "BOXCAR_HOME": te.home}[k]
	}, stdout: &stdout, stderr: &stderr, publish: policy}
	err := run(ctx, e, args)
	return stdout.String(), stderr.String(), err
}

// storedJobIDs lists the job ids on the job stream, from the subjects (boxcar.jobs.default.ID).
func (te *testEnv) storedJobIDs(t *testing.T) []string {
	t.Helper()
	s, err := te.js.Stream(t.Context(), "BOXCAR_JOBS_default")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(t.Context(), seq)
		if err != nil {
			continue // deleted
		}
		ids = append(ids, strings.TrimPrefix(m.Subject, "boxcar.jobs.default."))
	}
	return ids
}

// submitResult is what one submit command did.
type submitResult struct {
	stdout, stderr string
	err            error
}

// submitAckLostAcrossRestart runs submit with args through a proxy that drops the acks of the
// job subjects' publishes, restarts the server once the stream holds the job, and returns what
// submit did then.
func (te *testEnv) submitAckLostAcrossRestart(t *testing.T, args ...string) submitResult {
	t.Helper()
	proxy := newAckDropper(t, te.ns.Addr().String(), "boxcar.jobs.default.")
	done := make(chan submitResult, 1)
	go func() {
		stdout, stderr, err := te.submitVia(t, publishPolicy{attempt: time.Second, budget: time.Minute}, proxy.url(), args...)
		done <- submitResult{stdout, stderr, err}
	}()
	select {
	case <-proxy.seen:
	case r := <-done:
		t.Fatalf("submit ended before publishing: %v\n%s\n%s", r.err, r.stdout, r.stderr)
	}
	waitFor(t, "the job on the stream", func() bool { return len(te.storedJobIDs(t)) == 1 })
	te.restart(t)
	proxy.reset()
	return <-done
}

// TestRunAckLostAcrossRestart: the server stores the job, restarts before its ack reaches
// submit; submit retries with the same message id, the server drops the retry as a duplicate,
// and submit reports the job as submitted, once. (Before, it exited 1 with a deadline error for
// a job that then ran, and a script's retry ran it twice under two ids.)
func TestRunAckLostAcrossRestart(t *testing.T) {
	te := newTestEnv(t)
	r := te.submitAckLostAcrossRestart(t, "run", "--profile", "csv-analyst", "--task", "Summarise")
	id := strings.TrimSpace(r.stdout)
	if r.err != nil {
		t.Fatalf("submit run: exit %d, %v\n%s", exitCode(r.err), r.err, r.stderr)
	}
	waitFor(t, "the test's connection after the restart", func() bool {
		_, err := te.js.Stream(t.Context(), "BOXCAR_JOBS_default")
		return err == nil
	})
	if ids := te.storedJobIDs(t); len(ids) != 1 || ids[0] != id {
		t.Errorf("job stream holds %v; want the one job %s", ids, id)
	}
	if strings.Contains(r.stderr, "already submitted") {
		t.Errorf("submit calls its own retry a second submission:\n%s", r.stderr)
	}
}

// TestRunUnknownOutcome: no ack ever comes back. submit says so, prints the id and exits 9.
func TestRunUnknownOutcome(t *testing.T) {
	te := newTestEnv(t)
	proxy := newAckDropper(t, te.ns.Addr().String(), "boxcar.jobs.default.")
	for _, output := range []string{"text", "json"} {
		t.Run(output, func(t *testing.T) {
			proxy.arm()
			stdout, errOut, err := te.submitVia(t, publishPolicy{attempt: 500 * time.Millisecond, budget: 3 * time.Second}, proxy.url(),
				"run", "--profile", "csv-analyst", "--task", "Summarise", "--output", output)
			proxy.reset()
			msg := message(err)
			if output == "json" { // the error is a JSON object on stderr
				e := jsonError(t, errOut)
				msg = e.Message
				if e.Code != codeUnknownOutcome {
					t.Errorf("error code %q, want %s", e.Code, codeUnknownOutcome)
				}
			}
			if exitCode(err) != exitUnknown || !strings.Contains(msg, "did not confirm") || !strings.Contains(msg, "--id") {
				t.Fatalf("exit %d, %q; want exit %d saying the outcome is unknown", exitCode(err), msg, exitUnknown)
			}
			id := strings.TrimSpace(stdout)
			if output == "json" {
				st := lastJSON(t, stdout)
				if st["state"] != "unknown" {
					t.Errorf("json = %v, want state unknown", st)
				}
				id, _ = st["id"].(string)
			}
			if !strings.Contains(msg, id) {
				t.Errorf("message %q does not name the printed id %q", msg, id)
			}
			// It did arrive: submitting again with the id is dropped.
			stdout, stderr, err := te.submit(t, "run", "--profile", "csv-analyst", "--task", "Summarise", "--id", id)
			if err != nil || strings.TrimSpace(stdout) != id || !strings.Contains(stderr, "already submitted") {
				t.Errorf("run --id %s after an unknown outcome: %v\n%s%s", id, err, stdout, stderr)
			}
		})
	}
	if ids := te.storedJobIDs(t); len(ids) != 2 {
		t.Errorf("job stream holds %v; want the two jobs once each", ids)
	}
}

func TestRunID(t *testing.T) {
	te := newTestEnv(t)
	for _, bad := range []string{"short", "UPPER-case-id", "-leading-dash", "has space inside", strings.Repeat("a", 65), "../../etc"} {
		if _, _, err := te.submit(t, "run", "--profile", "p", "--task", "t", "--id", bad); exitCode(err) != 1 || !strings.Contains(message(err), "is not a job id") {
			t.Errorf("run --id %q: %v; want exit 1, not a job id", bad, err)
		}
	}
	const id = "nightly-report-2026-12-02"
	for i, want := range []string{"", "already submitted"} {
		stdout, stderr, err := te.submit(t, "run", "--profile", "csv-analyst", "--task", "t", "--id", id)
		if err != nil || strings.TrimSpace(stdout) != id || !strings.Contains(stderr, want) {
			t.Errorf("run --id, submission %d: %v\nstdout %q\nstderr %q", i+1, err, stdout, stderr)
		}
	}
	if ids := te.storedJobIDs(t); len(ids) != 1 || ids[0] != id {
		t.Errorf("job stream holds %v; want %s once", ids, id)
	}
}
