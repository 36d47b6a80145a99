package agent_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/modelgate"
)

// outage is a probe for a modelgate.Gate: the endpoint is down until up is set. Probes do not
// reach the scripted server, whose replies are the chat requests' only.
type outage struct {
	up     atomic.Bool
	probes atomic.Int64
}

func (o *outage) probe(context.Context) (*http.Response, error) {
	o.probes.Add(1)
	if o.up.Load() {
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
	}
	return &http.Response{StatusCode: http.StatusServiceUnavailable, Body: http.NoBody}, nil
}

// gated returns a gate that opens after 3 failed attempts (one chat request with the tests'
// 2 retries) and probes o every few milliseconds; downs receives each opening.
func gated(t *testing.T, o *outage) (*modelgate.Gate, <-chan struct{}) {
	t.Helper()
	downs := make(chan struct{}, 16)
	g, err := modelgate.New(modelgate.Config{Threshold: 3, MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		Probe: o.probe, OnChange: func(up bool) {
			if !up {
				downs <- struct{}{}
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	return g, downs
}

// TestTurnWaitsForTheModelGate: a turn that finds the endpoint down waits until a probe is
// answered and is sent again; the run ends as it would have without the outage, with the same
// turns spent.
func TestTurnWaitsForTheModelGate(t *testing.T) {
	fast := map[string]string{"retry-after-ms": "1"}
	s := newScript(t, toolCalls(1000, call{"a", "emit", `{"text":"a"}`}),
		apiError(503, "", "overloaded", fast), apiError(502, "", "bad gateway", fast), apiError(503, "", "overloaded", fast),
		final("done"))
	o := &outage{}
	g, downs := gated(t, o)
	go func() {
		<-downs
		// Up only after a probe failed: the turn waited through it.
		for o.probes.Load() < 2 {
			time.Sleep(time.Millisecond)
		}
		o.up.Store(true)
	}()
	req := request(csvProfile(t, emitTool), newFakeSandbox(nil))
	var mu sync.Mutex
	var events []agent.Event
	req.Progress = func(e agent.Event) { mu.Lock(); events = append(events, e); mu.Unlock() }
	res, err := newAgent(t, s, func(c *agent.Config) { c.Gate = g }).Run(context.Background(), req)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Outcome != agent.OutcomeCompleted || res.FinalMessage != "done" {
		t.Fatalf("outcome %q final %q, want completed with the answer after the outage", res.Outcome, res.FinalMessage)
	}
	if want := (agent.Budget{Turns: 2, ToolCalls: 1, Tokens: 1500}); res.Spent != want || res.Turns != 2 {
		t.Errorf("spent %+v turns %d, want %+v and 2 turns, as without the outage", res.Spent, res.Turns, want)
	}
	if n := len(s.requests()); n != 5 {
		t.Errorf("%d chat requests, want 5: 2 answered, 3 attempts of the refused one", n)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, e := range events {
		if e.Spent.Turns > 2 {
			t.Errorf("event %s turn %d reports %d turns spent, more than the run's 2", e.Kind, e.Turn, e.Spent.Turns)
		}
	}
}

// TestModelGateWaitEndsAtTheJobTimeout: a job whose endpoint stays down waits until its own
// timeout, and then ends with ErrModelUnavailable (to be tried again), not capped: it hit no
// cap of its own.
func TestModelGateWaitEndsAtTheJobTimeout(t *testing.T) {
	fast := map[string]string{"retry-after-ms": "1"}
	s := newScript(t, apiError(503, "", "overloaded", fast), apiError(503, "", "overloaded", fast), apiError(503, "", "overloaded", fast))
	g, _ := gated(t, &outage{})
	p := csvProfile(t)
	p.Limits.JobTimeout = config.Duration(500 * time.Millisecond)
	res, err := newAgent(t, s, func(c *agent.Config) { c.Gate = g }).Run(context.Background(), request(p, newFakeSandbox(nil)))
	if !errors.Is(err, agent.ErrModelUnavailable) {
		t.Fatalf("Run: %v (outcome %q cap %q), want ErrModelUnavailable", err, res.Outcome, res.Cap)
	}
	if res.Cap != "" || res.Spent.Turns != 0 {
		t.Errorf("cap %q, %d turns spent; want no cap and no turn", res.Cap, res.Spent.Turns)
	}
}

// TestModelGateWaitEndsWithTheCaller: a shutdown or cancel ends the wait at once with the
// caller's cause.
func TestModelGateWaitEndsWithTheCaller(t *testing.T) {
	fast := map[string]string{"retry-after-ms": "1"}
	s := newScript(t, apiError(503, "", "overloaded", fast), apiError(503, "", "overloaded", fast), apiError(503, "", "overloaded", fast))
	g, downs := gated(t, &outage{})
	ctx, cancel := context.WithCancelCause(context.Background())
	stop := errors.New("worker shutting down")
	go func() { <-downs; cancel(stop) }()
	_, err := newAgent(t, s, func(c *agent.Config) { c.Gate = g }).Run(ctx, request(csvProfile(t), newFakeSandbox(nil)))
	if !errors.Is(err, stop) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v, want the caller's cause", err)
	}
}

// TestFailureTheModelGateLetsPassEndsTheRun: a request that failed while the gate still lets
// requests pass (fewer failures than its threshold) ends the run as without a gate: the gate
// is for an outage, not a reason to send a turn again and again.
func TestFailureTheModelGateLetsPassEndsTheRun(t *testing.T) {
	fast := map[string]string{"retry-after-ms": "1"}
	s := newScript(t, apiError(503, "", "overloaded", fast), apiError(503, "", "overloaded", fast), apiError(503, "", "overloaded", fast))
	g, err := modelgate.New(modelgate.Config{Threshold: 10, Probe: (&outage{}).probe})
	if err != nil {
		t.Fatal(err)
	}
	_, err = newAgent(t, s, func(c *agent.Config) { c.Gate = g }).Run(context.Background(), request(csvProfile(t), newFakeSandbox(nil)))
	if !errors.Is(err, agent.ErrModelUnavailable) {
		t.Fatalf("Run: %v, want ErrModelUnavailable", err)
	}
	if n := len(s.requests()); n != 3 {
		t.Errorf("%d requests, want the 3 attempts of one", n)
	}
}
