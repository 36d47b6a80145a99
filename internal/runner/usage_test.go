package runner_test

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/demomodel"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
)

// budgetRig is a bundle whose workers run the real agent against the scripted demo model, with
// the default tenant's daily_tokens set to limit and its day's usage in the real bucket.
type budgetRig struct {
	*bundle
	usage *queue.Usage
	m     *metrics.Metrics
}

func newBudgetRig(t *testing.T, limit int64, opts ...func(*runner.Config)) *budgetRig {
	t.Helper()
	return newBudgetRigOn(t, limit, newStoppable(t).srv, opts...)
}

// newBudgetRigOn is newBudgetRig with model for the model endpoint.
func newBudgetRigOn(t *testing.T, limit int64, model *httptest.Server, opts ...func(*runner.Config)) *budgetRig {
	t.Helper()
	b := setup(t)
	cfg, err := config.Parse([]byte(demoProfile + "tenants:\n  default: {profiles: [d], daily_tokens: " + strconv.FormatInt(limit, 10) + "}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.NATS = b.cfg.NATS
	b.cfg = cfg
	u, err := queue.OpenUsage(t.Context(), b.nc, []string{job.DefaultTenant}, true)
	if err != nil {
		t.Fatal(err)
	}
	ag, err := agent.New(agent.Config{BaseURL: model.URL + "/v1", HTTPClient: model.Client(), MaxRetries: 1, Profiles: b.cfg.Profiles})
	if err != nil {
		t.Fatal(err)
	}
	r := &budgetRig{bundle: b, usage: u, m: metrics.New()}
	b.worker(ag, append([]func(*runner.Config){func(c *runner.Config) { c.Usage, c.Metrics = u, r.m }}, opts...)...)
	return r
}

func (r *budgetRig) today(t *testing.T) int64 {
	t.Helper()
	return r.on(t, time.Now())
}

// on is the default tenant's tokens of the UTC day of at.
func (r *budgetRig) on(t *testing.T, at time.Time) int64 {
	t.Helper()
	d, err := r.usage.Day(context.Background(), job.DefaultTenant, at)
	if err != nil {
		t.Fatal(err)
	}
	return d.Tokens
}

// TestTenantDailyTokens: every model answer's tokens are added to the tenant's day in its
// bucket BOXCAR_USAGE_default and boxcar_tenant_tokens_total; before each model request the day is checked
// against the tenant's daily_tokens, and a job that finds it spent, before its first request or
// between two, ends at its first attempt capped as budget_exhausted, saying whose budget and how
// large, with no dead letter. The demo model's job takes two model requests.
func TestTenantDailyTokens(t *testing.T) {
	t.Parallel()
	// What one job spends, from a run with room to spare.
	base := newBudgetRig(t, 1<<40)
	st := base.waitFinal(base.submit("d").ID, 30*time.Second)
	perJob := st.SpentTokens
	if st.State != job.StateSucceeded || perJob == 0 || st.SpentTurns != 2 {
		t.Fatalf("baseline: %s, %d tokens in %d turns: %s", st.State, perJob, st.SpentTurns, st.Error)
	}
	if got := base.today(t); got != perJob {
		t.Errorf("the day's usage is %d, the job spent %d", got, perJob)
	}
	if got := testutil.ToFloat64(base.m.TenantTokens.WithLabelValues(job.DefaultTenant)); int64(got) != perJob {
		t.Errorf("boxcar_tenant_tokens_total = %v, want %d", got, perJob)
	}

	tests := []struct {
		name        string
		limit       int64
		spentBefore int64
		state       job.State
		turns       int   // model requests the job sent
		usageAfter  int64 // the day's tokens after the job; -1: more than spentBefore
	}{
		{name: "unlimited", limit: 0, spentBefore: 100 * perJob, state: job.StateSucceeded, turns: 2, usageAfter: 101 * perJob},
		{name: "room for the job", limit: 3 * perJob, state: job.StateSucceeded, turns: 2, usageAfter: perJob},
		{name: "spent before the job", limit: perJob, spentBefore: perJob, state: job.StateCapped, turns: 0, usageAfter: perJob},
		{name: "spent during the job", limit: 1, state: job.StateCapped, turns: 1, usageAfter: -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newBudgetRig(t, tt.limit)
			if tt.spentBefore > 0 {
				if _, err := r.usage.Add(context.Background(), job.DefaultTenant, time.Now(), tt.spentBefore, tt.limit); err != nil {
					t.Fatal(err)
				}
			}
			j := r.submit("d")
			st := r.waitFinal(j.ID, 30*time.Second)
			if st.State != tt.state || st.Attempt != 1 || st.SpentTurns != tt.turns {
				t.Fatalf("%s at attempt %d after %d turns (%s); want %s at attempt 1 after %d", st.State, st.Attempt, st.SpentTurns, st.Error, tt.state, tt.turns)
			}
			usage := r.today(t)
			if (tt.usageAfter >= 0 && usage != tt.usageAfter) || (tt.usageAfter < 0 && usage <= tt.spentBefore) {
				t.Errorf("the day's usage is %d after the job, want %d", usage, tt.usageAfter)
			}
			remaining := testutil.ToFloat64(r.m.TenantBudgetRemaining.WithLabelValues(job.DefaultTenant))
			if want := float64(max(tt.limit-usage, 0)); tt.limit > 0 && remaining != want {
				t.Errorf("boxcar_tenant_budget_remaining_tokens = %v, want %v", remaining, want)
			}
			if tt.state != job.StateCapped {
				return
			}
			says := "tenant default has spent " + strconv.FormatInt(usage, 10) + " tokens today"
			if st.Cap != "budget_exhausted" || !strings.Contains(st.Error, says) || !strings.Contains(st.Error, "daily_tokens of "+strconv.FormatInt(tt.limit, 10)) {
				t.Errorf("status cap %q, error %q; want budget_exhausted saying %q and the daily_tokens", st.Cap, st.Error, says)
			}
			if out := r.manifest(j.ID).Predicate.Outcome; out.State != job.StateCapped || out.Cap != "budget_exhausted" {
				t.Errorf("manifest outcome %+v, want capped by budget_exhausted", out)
			}
			if dl := r.deadLetters(); len(dl) != 0 {
				t.Errorf("dead letters %+v; a capped job has none", dl)
			}
		})
	}
}

// TestBudgetDayIsTheServers: a worker whose clock is ahead counts and checks the tenant's
// tokens on the NATS server's day, which every worker shares, not on its own: by its own clock
// it would find a fresh day and let a tenant that spent today's budget spend again. (The test
// machine's clock is the server's here; a day ahead stands for a worker past midnight early.)
func TestBudgetDayIsTheServers(t *testing.T) {
	t.Parallel()
	const ahead, limit = 24 * time.Hour, 10
	r := newBudgetRig(t, limit, func(c *runner.Config) { c.Now = func() time.Time { return time.Now().Add(ahead) } })
	if _, err := r.usage.Add(context.Background(), job.DefaultTenant, time.Now(), limit, limit); err != nil {
		t.Fatal(err)
	}
	st := r.waitFinal(r.submit("d").ID, 30*time.Second)
	if st.State != job.StateCapped || st.Cap != "budget_exhausted" || st.Attempt != 1 || st.SpentTurns != 0 {
		t.Fatalf("%s (cap %q) at attempt %d after %d turns (%s); want capped by budget_exhausted at attempt 1 before the first",
			st.State, st.Cap, st.Attempt, st.SpentTurns, st.Error)
	}
	if got := r.today(t); got != limit {
		t.Errorf("the server's day holds %d tokens, want the %d spent before the job", got, limit)
	}
	if got := r.on(t, time.Now().Add(ahead)); got != 0 {
		t.Errorf("the worker's own day holds %d tokens, want none", got)
	}
}

// withoutUsage serves the demo model's answers with their usage taken out, as endpoints that
// report none do.
func withoutUsage(t *testing.T) *httptest.Server {
	t.Helper()
	model := demomodel.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		model.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		var answer map[string]any
		if r.URL.Path == "/v1/chat/completions" && json.Unmarshal(body, &answer) == nil {
			delete(answer, "usage")
			body, _ = json.Marshal(answer)
		}
		maps.Copy(w.Header(), rec.Header())
		w.Header().Del("Content-Length")
		w.WriteHeader(rec.Code)
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestTokensEstimatedWithoutUsage: answers with no usage still spend the tenant's day, with the
// agent's estimate, so daily_tokens stops the job; the manifest marks each such call's tokens
// as estimated, and boxcar_model_tokens_estimated_total counts them.
func TestTokensEstimatedWithoutUsage(t *testing.T) {
	t.Parallel()
	r := newBudgetRigOn(t, 1, withoutUsage(t))
	j := r.submit("d")
	st := r.waitFinal(j.ID, 30*time.Second)
	if st.State != job.StateCapped || st.Cap != "budget_exhausted" || st.SpentTurns != 1 || st.SpentTokens <= 1 {
		t.Fatalf("%s (cap %q) after %d turns and %d tokens: %s; want capped by budget_exhausted after one turn", st.State, st.Cap, st.SpentTurns, st.SpentTokens, st.Error)
	}
	if day := r.today(t); day != st.SpentTokens {
		t.Errorf("the day's usage is %d, the job spent %d", day, st.SpentTokens)
	}
	m := r.manifest(j.ID).Predicate
	if !m.Model.Usage.Estimated || m.Usage == nil || len(m.Usage.ModelCalls) != 1 || !m.Usage.ModelCalls[0].TokensEstimated {
		t.Errorf("manifest model usage %+v, usage record %+v; want one call, its tokens marked estimated", m.Model.Usage, m.Usage)
	}
	if got := testutil.ToFloat64(r.m.ModelTokensEstimated.WithLabelValues("d")); int64(got) != st.SpentTokens {
		t.Errorf("boxcar_model_tokens_estimated_total = %v, want the job's %d tokens", got, st.SpentTokens)
	}
}

// TestManifestUsageRecord: the signed manifest's usage record holds each answered model call
// with its tokens (adding up to the model usage), the tool calls, the wall time of each phase,
// and says what the sandbox backend could not count.
func TestManifestUsageRecord(t *testing.T) {
	t.Parallel()
	r := newBudgetRig(t, 0)
	j := r.submit("d")
	if st := r.waitFinal(j.ID, 30*time.Second); st.State != job.StateSucceeded {
		t.Fatalf("%s: %s", st.State, st.Error)
	}
	m := r.manifest(j.ID).Predicate
	u := m.Usage
	if u == nil || len(u.ModelCalls) != 2 || u.ToolCalls != len(m.ToolCalls) || u.ToolCalls == 0 {
		t.Fatalf("usage %+v, want 2 model calls and the manifest's %d tool calls", u, len(m.ToolCalls))
	}
	var total int64
	for i, c := range u.ModelCalls {
		total += c.TotalTokens
		if c.Turn != i+1 || c.ResponseID != m.Model.ResponseIDs[i] || c.TotalTokens != c.PromptTokens+c.CompletionTokens || c.DurationMS < 0 {
			t.Errorf("model call %d: %+v (response ids %v)", i, c, m.Model.ResponseIDs)
		}
	}
	if total != m.Model.Usage.TotalTokens {
		t.Errorf("the calls' tokens add up to %d, the model usage says %d", total, m.Model.Usage.TotalTokens)
	}
	for _, phase := range []string{"admit", "claim", "prepare", "run", "collect", "commit"} {
		if ms, ok := u.PhasesMS[phase]; !ok || ms < 0 {
			t.Errorf("phase %s: %d ms, present %v; phases %v", phase, ms, ok, u.PhasesMS)
		}
	}
	if s := u.Sandbox; s == nil || len(s.Missing) != 1 || !strings.Contains(s.Missing[0], "fake backend does not count them") {
		t.Errorf("sandbox usage %+v, want it to say the fake backend counts nothing", s)
	}
}
