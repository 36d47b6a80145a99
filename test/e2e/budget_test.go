//go:build integration

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/test/harness"
	"github.com/boxcar-run/boxcar/test/testworker"
)

// budgetModel is a scripted endpoint for the budget profile of testdata/budget.yaml: it calls
// emit on every turn and never answers on its own, 100 tokens a response. While hanging is
// set it stops answering from the third request on, and reports that it did.
type budgetModel struct {
	url  string
	hung chan struct{} // closed at the first request it does not answer

	mu       sync.Mutex
	requests int
	hanging  bool
	once     sync.Once
}

func newBudgetModel(t *testing.T) *budgetModel {
	t.Helper()
	m := &budgetModel{hung: make(chan struct{}), hanging: true}
	srv := httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(srv.Close)
	m.url = srv.URL + "/v1"
	return m
}

func (m *budgetModel) answerAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.hanging = false
}

func (m *budgetModel) serve(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model    string `json:"model"`
		Messages []struct {
			Role string `json:"role"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	m.mu.Lock()
	m.requests++
	hang := m.hanging && m.requests >= 3
	m.mu.Unlock()
	if hang {
		m.once.Do(func() { close(m.hung) })
		<-r.Context().Done() // until the worker gives up on it
		return
	}
	step := 1
	for _, msg := range req.Messages {
		if msg.Role == "assistant" {
			step++
		}
	}
	harness.Completion{ID: fmt.Sprintf("chatcmpl-budget-%d", step), Model: req.Model, Prompt: 80, Complete: 20,
		Calls: []harness.ToolCall{{ID: fmt.Sprintf("call_%d", step), Name: "emit", Args: map[string]string{"text": fmt.Sprintf("step %d", step)}}}}.Write(w)
}

// startWorkerIn runs `worker --embedded` on dataDir until stop is called (or the test ends),
// so a second worker can take over the first one's NATS and store.
func startWorkerIn(t *testing.T, dataDir, modelURL string, extraArgs ...string) (w *worker, stop func()) {
	t.Helper()
	w = &worker{testworker.Start(t, testworker.Config{DataDir: dataDir, Model: modelURL, Args: append([]string{"--metrics-addr", "off"}, extraArgs...)})}
	return w, func() { w.Stop(t) }
}

// TestBudgetSurvivesRedelivery interrupts a job half way (its worker shuts down while the
// model is thinking) and lets a second worker finish it. The second attempt starts from what
// the first one spent: with max_tool_calls 3 and 2 calls made before, it makes exactly one.
func TestBudgetSurvivesRedelivery(t *testing.T) {
	t.Parallel()
	m := newBudgetModel(t)
	dataDir := t.TempDir()
	w1, stop1 := startWorkerIn(t, dataDir, m.url, "--config", "testdata/budget.yaml")
	stdout, stderr, err := w1.submit(t, "run", "--profile", "budget", "--task", "Emit until stopped.", "--output", "json")
	if err != nil {
		t.Fatalf("submit run: %v\n%s", err, stderr)
	}
	id := lastJSON(t, stdout)["id"].(string)
	select {
	case <-m.hung:
	case <-time.After(60 * time.Second):
		t.Fatal("the job never reached its third model request")
	}
	// Recorded while the third request is in flight: a crash now would lose nothing.
	stdout, _, err = w1.submit(t, "status", id, "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(lastJSON(t, stdout)["spent"]); got != "map[tokens:200 tool_calls:2 turns:3]" {
		t.Errorf("spent during the third request = %s, want 3 turns (the one in flight), 2 tool calls, 200 tokens", got)
	}
	stop1()

	m.answerAll()
	w2, _ := startWorkerIn(t, dataDir, m.url, "--config", "testdata/budget.yaml")
	stdout, stderr, err = w2.submit(t, "watch", id, "--output", "json", "--timeout", "2m")
	if code := exitCode(err); code != 3 {
		t.Fatalf("watch: exit %d (%v), want 3 (capped)\n%s", code, err, stderr)
	}
	if !strings.Contains(err.Error(), "(cap: max_tool_calls)") {
		t.Errorf("watch's message %q does not name the cap", err)
	}
	st := lastJSON(t, stdout)
	if st["state"] != "capped" || st["cap"] != "max_tool_calls" || st["attempt"] != 2.0 {
		t.Errorf("final status = %v, want capped by max_tool_calls in attempt 2", st)
	}
	if got := fmt.Sprint(st["spent"]); got != "map[tokens:400 tool_calls:3 turns:5]" {
		t.Errorf("spent = %s, want 5 turns, 3 tool calls (the cap, never more), 400 tokens", got)
	}
	text, _, err := w2.submit(t, "status", id)
	if err != nil || !strings.Contains(text, "spent:    5 turns, 3 tool calls, 400 tokens (all attempts)") {
		t.Errorf("submit status = %q, %v; want the spent budget", text, err)
	}

	// The manifest alone explains the cap: this attempt made one call, all attempts three.
	pred := storedManifest(t, w2, id).Predicate
	want := provenance.Spent{
		ThisAttempt: provenance.Budget{Turns: 2, ToolCalls: 1, Tokens: 200},
		AllAttempts: provenance.Budget{Turns: 5, ToolCalls: 3, Tokens: 400},
	}
	if pred.Spent != want || pred.Attempt != 2 || pred.Outcome.Cap != "max_tool_calls" || pred.Limits.MaxToolCalls != 3 {
		t.Errorf("manifest spent %+v in attempt %d, cap %q of %d tool calls; want %+v in attempt 2, capped at max_tool_calls 3",
			pred.Spent, pred.Attempt, pred.Outcome.Cap, pred.Limits.MaxToolCalls, want)
	}
	text, _, err = w2.submit(t, "manifest", id)
	if err != nil || !strings.Contains(text, "spent:     2 turns, 1 tool calls, 200 tokens in attempt 2; 5 turns, 3 tool calls, 400 tokens in all attempts") {
		t.Errorf("submit manifest = %q, %v; want both budgets", text, err)
	}

	// The second attempt's transcript: one call ran, the next was refused by the cap.
	transcript, err := os.ReadFile(filepath.Join(committedFolder(t, filepath.Join(dataDir, "store"), id), "transcript.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var ran, refused int
	for _, l := range bytes.Split(bytes.TrimSpace(transcript), []byte("\n")) {
		var v map[string]any
		if err := json.Unmarshal(l, &v); err != nil {
			t.Fatal(err)
		}
		if v["type"] != "tool_call" {
			continue
		}
		switch msg, _ := v["error"].(string); {
		case msg == "" && v["exec_ms"] != nil:
			ran++
		case msg == "not run: the job reached its cap of 3 tool calls (2 of them in earlier attempts)":
			refused++
		default:
			t.Errorf("unexpected tool call line: %s", l)
		}
	}
	if ran != 1 || refused != 1 {
		t.Errorf("the second attempt ran %d calls and refused %d, want 1 and 1", ran, refused)
	}
}
