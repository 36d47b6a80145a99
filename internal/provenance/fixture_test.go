package provenance_test

import (
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
)

const jobID = "20261202t101500-abcdef012345"

// exampleProfile is the csv-analyst profile of examples/boxcar.yaml, with its defaults.
func exampleProfile(t testing.TB) config.Profile {
	t.Helper()
	cfg, err := config.Parse(examples.Config)
	if err != nil {
		t.Fatal(err)
	}
	p, err := cfg.Profile("csv-analyst")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func ptr[T any](v T) *T { return &v }

// sampleManifest is a finished run of the example profile, as the runner would describe it.
func sampleManifest(t testing.TB) provenance.Manifest {
	t.Helper()
	p := exampleProfile(t)
	paris := time.FixedZone("CET", 3600)
	started := time.Date(2026, 12, 2, 11, 15, 1, 500_000_000, paris)
	return provenance.Manifest{
		Job: provenance.Job{
			ID:                 jobID,
			Profile:            "csv-analyst",
			Task:               "Summarise sales.csv: totals per <region> & month.",
			Labels:             map[string]string{"team": "finance", "env": "test"},
			SubmittedAt:        time.Date(2026, 12, 2, 10, 15, 0, 0, time.UTC),
			SubmittedByClaimed: "alice",
		},
		Inputs: []provenance.Input{{Name: "sales.csv", SHA256: sha("sales"), Size: 5}},
		Profile: provenance.Profile{
			Name: "csv-analyst",
			Spec: p,
		},
		Sandbox: provenance.Sandbox{
			Backend: "bubblewrap", ID: "bwrap-" + jobID, CPU: p.Sandbox.CPU, Memory: p.Sandbox.Memory,
			Disk: p.Sandbox.Disk, PIDs: p.Sandbox.PIDs, Isolation: "user,mount,pid,ipc,uts,net namespaces; no network",
		},
		Model: provenance.Model{
			EndpointHost: "https://user:pass@api.example.test/v1?api-key=sk-test-QUERY",
			Name:         p.Model.Name,
			Params:       provenance.ModelParams{Temperature: ptr(0.0), TopP: ptr(0.9), Seed: ptr(int64(1<<62 + 1)), MaxCompletionTokens: 4096},
			ResponseIDs:  []string{"chatcmpl-1", "chatcmpl-2"},
			Usage:        provenance.Usage{PromptTokens: 1200, CompletionTokens: 300, TotalTokens: 1500},
		},
		ToolCalls: []provenance.ToolCall{
			{ID: "call_1", Tool: "csv_stats", ArgsSHA256: sha(`{"path":"sales.csv"}`), ExitCode: 0, DurationMS: 42},
			{ID: "call_2", Tool: "write_file", ArgsSHA256: sha(`{"path":"report.md"}`), ExitCode: 1, Truncated: true, Error: "disk full", DurationMS: 3},
			{ID: "call_3", Tool: "shell", ArgsSHA256: sha(`{"command":["make","test"]}`), ExitCode: 0, DurationMS: 61_000,
				Approval: provenance.Approval{Policy: config.PolicyAsk, Decision: job.DecisionApproved, DecidedBy: "bob@ops-1",
					DecidedAt: time.Date(2026, 12, 2, 11, 16, 2, 250_000_000, paris)}},
		},
		Limits: p.Limits.Tighten(&job.Limits{MaxTurns: 5}),
		Spent: provenance.Spent{
			ThisAttempt: provenance.Budget{Turns: 2, ToolCalls: 3, Tokens: 1500},
			AllAttempts: provenance.Budget{Turns: 4, ToolCalls: 5, Tokens: 2500},
		},
		Outcome: provenance.Outcome{State: job.StateSucceeded},
		Timings: provenance.Timings{
			QueuedAt:   time.Date(2026, 12, 2, 10, 15, 0, 100_000_000, time.UTC),
			StartedAt:  started,
			FinishedAt: started.Add(90 * time.Second),
		},
		Attempt: 1,
		Worker:  provenance.WorkerInfo("worker-1"),
		Tenant:  provenance.Tenant{Name: "team-a", Profiles: []string{"csv-analyst"}, DailyTokens: 2_000_000, MaxConcurrent: 4},
	}
}

func sampleSubjects() []provenance.Subject {
	return []provenance.Subject{
		{Name: "transcript.jsonl", SHA256: sha("transcript"), Size: 10},
		{Name: "report.md", SHA256: sha("report"), Size: 6},
		{Name: "artifacts/totals.csv", SHA256: sha("totals"), Size: 6},
	}
}
