package submitcmd

import (
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestStatusShowsTenantSpend: `submit status` adds what the tenant spent on the model today
// of its daily budget, as the workers keep it in the tenant's bucket BOXCAR_USAGE_default, and
// says nothing of it when no worker has kept any.
func TestStatusShowsTenantSpend(t *testing.T) {
	te := newTestEnv(t)
	id := te.submitJob(t)
	stdout, _, err := te.submit(t, "status", id)
	if err != nil || strings.Contains(stdout, "tenant:") {
		t.Fatalf("status before any usage: %v\n%s", err, stdout)
	}
	nc, err := queue.Connect(t.Context(), queue.ConnOptions{URL: te.natsURL, Name: "worker"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	u, err := queue.OpenUsage(t.Context(), nc, []string{job.DefaultTenant}, true)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		add, budget int64
		text        string
	}{
		{name: "unlimited", add: 1200, text: "tenant:   default, 1200 tokens spent today (" + time.Now().UTC().Format(time.DateOnly) + " UTC), no daily limit"},
		{name: "with a budget", add: 800, budget: 5000, text: "tenant:   default, 2000 tokens spent today (" + time.Now().UTC().Format(time.DateOnly) + " UTC), of its daily_tokens 5000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := u.Add(t.Context(), job.DefaultTenant, time.Now(), tt.add, tt.budget); err != nil {
				t.Fatal(err)
			}
			stdout, _, err := te.submit(t, "status", id)
			// A line of its own: the line's newline was escaped with the line, so status ended
			// in a literal \n and no newline.
			if err != nil || !strings.HasSuffix(stdout, "\n"+tt.text+"\n") {
				t.Errorf("status: %v\n%s\nwant %q", err, stdout, tt.text)
			}
			stdout, _, err = te.submit(t, "status", id, "--output", "json")
			tenant, _ := lastJSON(t, stdout)["tenant"].(map[string]any)
			if err != nil || tenant["name"] != job.DefaultTenant || tenant["daily_tokens"] != float64(tt.budget) {
				t.Errorf("status --output json: %v, tenant %v", err, tenant)
			}
		})
	}
}
