package runner

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"fmt"
	"strings"
	"sync"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/store"
)

// manifest records what produced this run: input, profile, sandbox, model calls, tool calls,
// outcome and the worker's build. It never holds a secret: the API key is not in anything it
// is built from. Its subjects name the objects in the attempt's folder.
func (r *Runner) manifest(a *attempt, run ran, folder string, subs []stored, collected provenance.Collected, dec decision, runErr error) ([]byte, error) {
	j, p, res, sb := a.job, a.profile, run.result, run.sandbox
	profile, err := r.profiles.of(j.Profile, p)
	if err != nil {
		return nil, err
	}
	m := provenance.Manifest{
		Job:     provenance.Job{ID: j.ID, Profile: j.Profile, Task: j.Task, Labels: j.Labels, SubmittedAt: j.SubmittedAt, SubmittedByClaimed: j.SubmittedBy},
		Profile: profile,
		Sandbox: provenance.Sandbox{
			Backend: sb.Backend, ID: sb.ID, Image: sb.Image, ImageDigest: sb.ImageDigest,
			CPU: sb.CPU, Memory: sb.Memory, Disk: sb.Disk, PIDs: sb.PIDs, Isolation: sb.Isolation,
			Seccomp: sb.Seccomp, SeccompDigest: sb.SeccompDigest,
			Warm: run.claim.warm, ClaimedAt: run.claim.at,
		},
		Collected: collected,
		Model: provenance.Model{
			EndpointHost: provenance.EndpointHost(r.cfg.ModelEndpoint),
			Name:         p.Model.Name,
			Params: provenance.ModelParams{
				Temperature: p.Model.Temperature, TopP: p.Model.TopP, Seed: p.Model.Seed, MaxCompletionTokens: p.Model.MaxCompletionTokens,
			},
			ResponseIDs: res.ResponseIDs,
			Usage:       provenance.Usage(res.Usage),
		},
		Limits:  a.limits,
		Spent:   spent(run),
		Outcome: provenance.Outcome{State: dec.state, Cap: cmp.Or(dec.capHit, res.Cap)},
		Timings: provenance.Timings{QueuedAt: a.d.Published, StartedAt: a.started, FinishedAt: r.cfg.Now()},
		Attempt: a.d.Attempt,
		Worker:  provenance.WorkerInfo(r.cfg.Worker.WorkerID),
		Egress:  run.egress,
		Usage:   runUsage(a, run),
		Tenant: provenance.Tenant{Name: a.tenant, Profiles: a.grant.Profiles, DailyTokens: a.grant.DailyTokens,
			MaxConcurrent: a.grant.MaxConcurrent},
	}
	if res.Model != "" {
		m.Model.Name = res.Model
	}
	if runErr != nil {
		m.Outcome.Error = errorText(runErr)
	}
	if dec.state == job.StateFailed || dec.state == job.StateDead || dec.state == job.StateRejected {
		m.Outcome.Reason = dec.reason
	}
	for _, in := range j.Inputs {
		m.Inputs = append(m.Inputs, provenance.Input{Name: in.Name, SHA256: in.SHA256, Size: in.Size})
	}
	for _, c := range res.ToolCalls {
		m.ToolCalls = append(m.ToolCalls, provenance.ToolCall{
			ID: c.ID, Tool: c.Tool, ArgsSHA256: c.ArgsSHA256, ExitCode: c.ExitCode, TimedOut: c.TimedOut,
			Truncated: c.Truncated, Error: c.Error, DurationMS: c.Duration.Milliseconds(), Approval: approval(c.Approval),
		})
	}
	inRun := strings.TrimPrefix(store.AttemptPrefix(j.ID, folder), store.RunPrefix(j.ID))
	subjects := make([]provenance.Subject, len(subs))
	for i, s := range subs {
		subjects[i] = provenance.Subject{Name: s.name, SHA256: s.sha256, Size: s.size, Path: inRun + s.name}
	}
	return provenance.Build(m, subjects)
}

// manifestProfiles holds each profile's manifest form (provenance.ProfileOf), made with the
// limits of the last of its jobs that committed: encoding the spec was a third of a
// manifest's work, a worker's profiles do not change while it runs, and most jobs keep their
// profile's limits. One entry a profile, however many limits jobs ask for.
type manifestProfiles struct {
	mu     sync.Mutex
	byName map[string]provenance.Profile
}

func (c *manifestProfiles) of(name string, spec config.Profile) (provenance.Profile, error) {
	c.mu.Lock()
	p, ok := c.byName[name]
	c.mu.Unlock()
	if ok && p.Spec.Limits == spec.Limits {
		return p, nil
	}
	p, err := provenance.ProfileOf(name, spec)
	if err != nil {
		return provenance.Profile{}, fmt.Errorf("manifest: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byName == nil {
		c.byName = map[string]provenance.Profile{}
	}
	c.byName[name] = p
	return p, nil
}

// spent is what this attempt and all attempts of the job used of its caps. The agent counts
// from what earlier attempts spent (Result.Spent includes them), except when it stopped before
// counting anything: then this attempt spent nothing.
func spent(run ran) provenance.Spent {
	all, before := run.result.Spent, run.earlier
	this := provenance.Budget{
		Turns:     max(all.Turns-before.Turns, 0),
		ToolCalls: max(all.ToolCalls-before.ToolCalls, 0),
		Tokens:    max(all.Tokens-before.Tokens, 0),
	}
	return provenance.Spent{
		ThisAttempt: this,
		AllAttempts: provenance.Budget{
			Turns:     before.Turns + this.Turns,
			ToolCalls: before.ToolCalls + this.ToolCalls,
			Tokens:    before.Tokens + this.Tokens,
		},
	}
}

// approval is the manifest's record of how the shell policy decided a call.
func approval(a *job.Approval) job.Approval {
	if a == nil {
		return job.Approval{}
	}
	return *a
}

func signManifest(ctx context.Context, manifest []byte, key ed25519.PrivateKey) ([]byte, error) {
	return provenance.Sign(ctx, manifest, key)
}
