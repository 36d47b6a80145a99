package submitcmd

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/boxcar-run/boxcar/internal/queue"
)

// tenantUsage is what the tenant submit acts for spent on the model today (the NATS server's
// UTC day, as the workers count it), from the tenant's bucket the workers keep and, during an
// upgrade, what older workers added in the shared one (queue.Usage.Day); nil when it cannot be
// read (no worker has kept it yet, or NATS refuses the read): status shows it only as an aside.
func (e *env) tenantUsage(ctx context.Context, nc *nats.Conn) map[string]any {
	u, err := queue.OpenUsage(ctx, nc, []string{e.tenant()}, false)
	if err != nil {
		return nil
	}
	now, err := u.Now(ctx) // the workers' budget day is the server's
	if err != nil {
		now = time.Now().UTC()
	}
	d, err := u.Day(ctx, e.tenant(), now)
	if err != nil || d.Tokens == 0 && d.DailyTokens == 0 { // nothing kept today: nothing to say
		return nil
	}
	return map[string]any{"name": e.tenant(), "day": now.Format(time.DateOnly), "tokens_today": d.Tokens, "daily_tokens": d.DailyTokens}
}

// usageLine says a tenantUsage in words.
func usageLine(u map[string]any) string {
	budget := "no daily limit"
	if l, _ := u["daily_tokens"].(int64); l > 0 {
		budget = fmt.Sprintf("of its daily_tokens %d", l)
	}
	return fmt.Sprintf("tenant:   %s, %d tokens spent today (%s UTC), %s", u["name"], u["tokens_today"], u["day"], budget)
}
