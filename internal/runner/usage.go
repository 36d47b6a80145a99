package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// Usage keeps the model tokens each tenant's jobs spent per UTC day, for the tenants' daily
// budgets (queue.Usage implements it on the tenants' buckets BOXCAR_USAGE_TENANT).
type Usage interface {
	// Now is the clock that decides the day: the NATS server's, which all workers share.
	Now(ctx context.Context) (time.Time, error)
	Day(ctx context.Context, tenant string, t time.Time) (queue.DayUsage, error)
	Add(ctx context.Context, tenant string, t time.Time, tokens, dailyTokens int64) (int64, error)
}

var _ Usage = (*queue.Usage)(nil)

// capBudgetExhausted is the cap of a job stopped by its tenant's daily_tokens.
const capBudgetExhausted = "budget_exhausted"

// errBudgetExhausted: the job's tenant spent its daily_tokens today.
var errBudgetExhausted = errors.New("the tenant's daily token budget is spent")

// usageTimeout bounds recording one answer's tokens, which runs on after the job's context
// ends: a job interrupted mid-answer still spent them.
const usageTimeout = 5 * time.Second

// tenantMeter holds a job's model requests to its tenant's daily_tokens (agent.Meter): the
// day's spending is read before each request and added to after each answer, so every worker's
// jobs of the tenant count against the one budget. A request over it ends the job capped.
type tenantMeter struct {
	r *Runner
	a *attempt
}

var _ agent.Meter = (*tenantMeter)(nil)

// meter is the attempt's agent.Meter; nil without a Usage, when nothing is metered.
func (r *Runner) meter(a *attempt) agent.Meter {
	if r.cfg.Usage == nil {
		return nil
	}
	return &tenantMeter{r: r, a: a}
}

// Allow refuses the request once the tenant's day is spent. When the bucket cannot be read the
// request goes ahead: a budget is a quota, not a guard, and NATS being slow must not fail jobs.
func (m *tenantMeter) Allow(ctx context.Context) error {
	limit := m.a.grant.DailyTokens
	if limit == 0 {
		return nil
	}
	now := m.day(ctx)
	d, err := m.r.cfg.Usage.Day(ctx, m.a.tenant, now)
	if err != nil {
		m.a.log.WarnContext(ctx, "reading the tenant's token usage failed; the model request goes ahead", "error", err)
		return nil
	}
	m.r.m.TenantBudgetRemaining.WithLabelValues(m.a.tenant).Set(float64(max(limit-d.Tokens, 0)))
	if d.Tokens < limit {
		return nil
	}
	return fmt.Errorf("%w: tenant %s has spent %d tokens today (%s UTC) of its daily_tokens of %d; its jobs reach the model again after midnight UTC, or raise tenants.%s.daily_tokens",
		errBudgetExhausted, m.a.tenant, d.Tokens, now.Format(time.DateOnly), limit, m.a.tenant)
}

// day is the time whose UTC day the tenant's tokens count on: the NATS server's, so that a
// worker whose clock is ahead does not start the new day early and let the tenant spend a
// second budget around midnight. When the server cannot say, the worker's own clock stands in
// (it is within job.ClockSkew of the server's) and the log says so.
func (m *tenantMeter) day(ctx context.Context) time.Time {
	now, err := m.r.cfg.Usage.Now(ctx)
	if err != nil {
		m.a.log.WarnContext(ctx, "reading the NATS server's time failed; the tenant's budget day is the worker's own", "error", err)
		return m.r.cfg.Now().UTC()
	}
	return now
}

// Spend adds an answer's tokens to the tenant's day.
func (m *tenantMeter) Spend(ctx context.Context, tokens int64) {
	if tokens <= 0 {
		return
	}
	m.r.m.TenantTokens.WithLabelValues(m.a.tenant).Add(float64(tokens))
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), usageTimeout)
	defer cancel()
	limit := m.a.grant.DailyTokens
	total, err := m.r.cfg.Usage.Add(ctx, m.a.tenant, m.day(ctx), tokens, limit)
	if err != nil {
		m.a.log.WarnContext(ctx, "recording the tenant's token usage failed", "tokens", tokens, "error", err)
		return
	}
	if limit > 0 {
		m.r.m.TenantBudgetRemaining.WithLabelValues(m.a.tenant).Set(float64(max(limit-total, 0)))
	}
}
