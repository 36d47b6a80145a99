package runner_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/store"
)

// answerCutter is a TCP proxy to the NATS server that, at the first client write holding
// marker, passes the write on and from then on drops what the server sends back on that
// connection, until the test cuts it: the server has the publish, the client never gets its
// answer, as when NATS goes away right after a publish landed. Later connections go through.
// With drop, it passes no write holding marker (passed: the first was seen).
type answerCutter struct {
	ln     net.Listener
	target string
	marker []byte
	wg     sync.WaitGroup

	// drop: a write holding marker never reaches the server, and its connection is closed
	// (each one that carries it), as when the worker dies before the publish.
	drop bool

	mu     sync.Mutex
	seen   bool
	conns  []net.Conn    // every side of every connection, closed at the end
	cut    []net.Conn    // the connection that carried marker: its two sides
	passed chan struct{} // closed when marker went through
}

func newAnswerCutter(t *testing.T, target, marker string) *answerCutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &answerCutter{ln: ln, target: target, marker: []byte(marker), passed: make(chan struct{})}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *answerCutter) url() string { return "nats://" + p.ln.Addr().String() }

func (p *answerCutter) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		var muted atomic.Bool
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			defer c.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 && !muted.Load() {
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		go p.forward(c, s, &muted)
	}
}

// forward copies the client's writes to the server, and mutes the server's answers on this
// connection once a write holding marker went through.
func (p *answerCutter) forward(c, s net.Conn, muted *atomic.Bool) {
	defer p.wg.Done()
	defer s.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 && p.drop && bytes.Contains(buf[:n], p.marker) {
			p.mu.Lock()
			if !p.seen {
				p.seen = true
				close(p.passed)
			}
			p.mu.Unlock()
			c.Close()
			return
		}
		if n > 0 {
			p.mu.Lock()
			first := !p.seen && bytes.Contains(buf[:n], p.marker)
			if first {
				p.seen = true
				muted.Store(true) // before the server can answer: it has not had the write yet
				p.cut = []net.Conn{c, s}
			}
			p.mu.Unlock()
			if _, werr := s.Write(buf[:n]); werr != nil {
				return
			}
			if first {
				close(p.passed)
			}
		}
		if err != nil {
			return
		}
	}
}

// cutNow closes the muted connection: the client sees NATS go away and connects again.
func (p *answerCutter) cutNow() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.cut {
		c.Close()
	}
}

// TestDeadLetterWhoseAnswerWasLostCounted: a job ends dead (the model refused the key); its
// dead letter's publish lands in the server, but NATS goes away before the answer reaches the
// worker. The worker tries again once NATS is back and finds the letter there: it is the one
// this delivery wrote, so boxcar_dead_letters_total counts it once. Before, a letter found
// was always another's, and a letter written through an outage was counted by no one.
func TestDeadLetterWhoseAnswerWasLostCounted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := newAnswerCutter(t, strings.TrimPrefix(b.url, "nats://"), " "+queue.DeadLetterStream(b.cfg.NATS, job.DefaultTenant)+".")
	b.url = p.url()
	refuse := agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		return agent.Result{}, fmt.Errorf("%w: HTTP 401 invalid key", agent.ErrModelAuth)
	})
	w := b.worker(refuse)
	id := b.submit("p").ID
	select {
	case <-p.passed:
	case <-time.After(time.Minute):
		t.Fatal("no dead letter was published")
	}
	// The letter is in the stream (read on the test's own connection), its answer held back:
	// now the worker's connection goes.
	waitFor(t, time.Minute, "the dead letter stored", func() bool {
		for _, dl := range b.deadLetters() {
			if dl.JobID == id {
				return true
			}
		}
		return false
	})
	p.cutNow()
	b.checkLetterCounted(w, id, job.StateFailed, "p", false)
}

// TestLetterLostBeforeItsPublishIsWrittenByTheNextDelivery: a job's end is committed and its
// status final, and its worker dies before its dead letter reaches the server (every publish
// of it is dropped, and the worker stopped). The job's next delivery, on another worker,
// finds the status final and writes the letter that was not written, once, and settles the
// message; with the status already final it must not take the job for ended and drop it
// without its letter.
func TestLetterLostBeforeItsPublishIsWrittenByTheNextDelivery(t *testing.T) {
	t.Parallel()
	refuse := agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		return agent.Result{}, fmt.Errorf("%w: HTTP 401 invalid key", agent.ErrModelAuth)
	})
	for _, tc := range []struct {
		name   string
		state  job.State
		reason string
		// job makes the job the first worker ends: its run's failure, or an end before the agent.
		job func(b *bundle) job.Job
		// last makes the first delivery the job's last: the next one is past max_deliver.
		last bool
	}{
		{name: "run committed failed", state: job.StateFailed, reason: "model_rejected", job: func(b *bundle) job.Job { return b.newJob("p", "t") }},
		{name: "end before the agent", state: job.StateFailed, reason: "input_missing", job: func(b *bundle) job.Job {
			j := b.newJob("p", "t")
			if err := b.store.Delete(context.Background(), store.InputKey(j.Inputs[0].SHA256)); err != nil {
				t.Fatal(err)
			}
			return j
		}},
		{name: "last delivery", state: job.StateFailed, reason: "model_rejected", last: true, job: func(b *bundle) job.Job { return b.newJob("p", "t") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			if tc.last {
				oneDelivery(b)
			}
			direct := b.url
			p := newAnswerCutter(t, strings.TrimPrefix(direct, "nats://"), " "+queue.DeadLetterStream(b.cfg.NATS, job.DefaultTenant)+".")
			p.drop = true
			b.url = p.url()
			first := b.worker(refuse)
			j := tc.job(b)
			b.publish(j)
			select {
			case <-p.passed:
			case <-time.After(time.Minute):
				t.Fatal("no dead letter was published")
			}
			if st, err := b.q.Status(context.Background(), j.ID); err != nil || st.State != tc.state {
				t.Fatalf("status once the letter was sent: %+v, %v; want %s, written before the letter", st, err, tc.state)
			}
			first.stop()
			b.url = direct
			second := b.worker(refuse)
			var letters []queue.DeadLetter
			for _, dl := range b.settledLetters() {
				if dl.JobID == j.ID {
					letters = append(letters, dl)
				}
			}
			second.stop()
			if len(letters) != 1 || letters[0].Reason != tc.reason {
				t.Errorf("%d dead letters of the job (%v), want one, reason %s", len(letters), letterReasons(letters), tc.reason)
			}
			if st := b.waitFinal(j.ID, 10*time.Second); st.State != tc.state {
				t.Errorf("status %+v, want %s", st, tc.state)
			}
		})
	}
}

func letterReasons(letters []queue.DeadLetter) (reasons []string) {
	for _, dl := range letters {
		reasons = append(reasons, fmt.Sprintf("%s at attempt %d", dl.Reason, dl.Attempt))
	}
	return reasons
}
