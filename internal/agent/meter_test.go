package agent_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/boxcar-run/boxcar/internal/agent"
)

// meter allows a number of model requests and records what each answer cost.
type meter struct {
	mu      sync.Mutex
	allowed int // requests still allowed
	asked   int
	spent   []int64
}

var _ agent.Meter = (*meter)(nil)

var errOverBudget = errors.New("over budget")

func (m *meter) Allow(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.asked++
	if m.allowed == 0 {
		return errOverBudget
	}
	m.allowed--
	return nil
}

func (m *meter) Spend(_ context.Context, tokens int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.spent = append(m.spent, tokens)
}

// TestMeter: the meter is asked before every model request, a refusal ends the run with its
// error and that request unsent (no turn counted), and each answer's tokens are spent, one call
// of Result.Calls each.
func TestMeter(t *testing.T) {
	tests := []struct {
		name      string
		allowed   int
		wantErr   error
		wantSent  int
		wantSpent []int64
	}{
		{name: "allowed throughout", allowed: 5, wantSent: 3, wantSpent: []int64{1000, 2000, 500}},
		{name: "refused before the first", allowed: 0, wantErr: errOverBudget, wantSent: 0},
		{name: "refused before the third", allowed: 2, wantErr: errOverBudget, wantSent: 2, wantSpent: []int64{1000, 2000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(t, toolCalls(1000, call{"c1", "list_files", `{}`}), toolCalls(2000, call{"c2", "list_files", `{}`}), final("done"))
			m := &meter{allowed: tt.allowed}
			req := request(csvProfile(t), newFakeSandbox(nil))
			req.Meter = m
			res, err := newAgent(t, s).Run(context.Background(), req)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("Run: %v, want %v", err, tt.wantErr)
			}
			if got := len(s.requests()); got != tt.wantSent || res.Spent.Turns != tt.wantSent {
				t.Errorf("%d requests sent, %d turns counted; want %d", got, res.Spent.Turns, tt.wantSent)
			}
			if len(m.spent) != len(tt.wantSpent) || len(res.Calls) != len(tt.wantSpent) {
				t.Fatalf("spent %v, calls %+v; want %v", m.spent, res.Calls, tt.wantSpent)
			}
			for i, want := range tt.wantSpent {
				if m.spent[i] != want || res.Calls[i].Usage.TotalTokens != want || res.Calls[i].Turn != i+1 || res.Calls[i].ResponseID == "" {
					t.Errorf("call %d: spent %d, recorded %+v; want %d tokens at turn %d", i, m.spent[i], res.Calls[i], want, i+1)
				}
			}
		})
	}
}
