package agent_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
)

// approver answers from a function.
type approver func(context.Context, agent.ApprovalRequest) (agent.Answer, error)

func (f approver) Approve(ctx context.Context, r agent.ApprovalRequest) (agent.Answer, error) {
	return f(ctx, r)
}

func TestShellPolicy(t *testing.T) {
	var asked []agent.ApprovalRequest
	decidedAt := time.Date(2026, 12, 2, 10, 16, 0, 0, time.UTC)
	yes := approver(func(_ context.Context, r agent.ApprovalRequest) (agent.Answer, error) {
		asked = append(asked, r)
		return agent.Answer{Approved: true, By: "alice@host", At: decidedAt}, nil
	})
	no := approver(func(context.Context, agent.ApprovalRequest) (agent.Answer, error) {
		return agent.Answer{By: "bob@host", At: decidedAt, Reason: "not today"}, nil
	})
	broken := approver(func(context.Context, agent.ApprovalRequest) (agent.Answer, error) {
		return agent.Answer{}, errors.New("queue down")
	})
	silent := approver(func(ctx context.Context, _ agent.ApprovalRequest) (agent.Answer, error) {
		<-ctx.Done()
		return agent.Answer{}, ctx.Err()
	})
	// Decided by the approvals transport, which marks the request expired when it gives up.
	expired := approver(func(ctx context.Context, _ agent.ApprovalRequest) (agent.Answer, error) {
		return agent.Answer{At: decidedAt}, fmt.Errorf("approval expired: %w", context.DeadlineExceeded)
	})
	// policy is how the record names a decision made by the profile alone.
	policy := func(p string, d job.Decision) *job.Approval { return &job.Approval{Policy: p, Decision: d} }
	tests := []struct {
		name         string
		policy       string
		allow        []string
		approver     agent.Approver
		args         string
		wantArgv     []string // nil: refused
		wantApproval *job.Approval
		waitEnded    bool // the agent stamps At itself, when the wait ended: checked for being set
	}{
		{name: "deny", policy: config.PolicyDeny, args: `{"command": ["ls", "-l"]}`,
			wantApproval: policy(config.PolicyDeny, job.DecisionDenied)},
		{name: "allowlist match", policy: config.PolicyAllowlist, allow: []string{"ls *"}, args: `{"command": ["ls", "-l"]}`, wantArgv: []string{"ls", "-l"},
			wantApproval: policy(config.PolicyAllowlist, job.DecisionApproved)},
		{name: "allowlist star crosses slashes", policy: config.PolicyAllowlist, allow: []string{"cat *"}, args: `{"command": ["cat", "data/sub/file.txt"]}`, wantArgv: []string{"cat", "data/sub/file.txt"},
			wantApproval: policy(config.PolicyAllowlist, job.DecisionApproved)},
		{name: "allowlist string form split on whitespace", policy: config.PolicyAllowlist, allow: []string{"git status"}, args: `{"command": "git   status"}`, wantArgv: []string{"git", "status"},
			wantApproval: policy(config.PolicyAllowlist, job.DecisionApproved)},
		{name: "allowlist mismatch", policy: config.PolicyAllowlist, allow: []string{"ls *"}, args: `{"command": ["rm", "-rf", "/"]}`,
			wantApproval: policy(config.PolicyAllowlist, job.DecisionDenied)},
		{name: "allowlist is anchored", policy: config.PolicyAllowlist, allow: []string{"ls"}, args: `{"command": ["ls", "-R", "/"]}`,
			wantApproval: policy(config.PolicyAllowlist, job.DecisionDenied)},
		{name: "allowlist no prefix trick", policy: config.PolicyAllowlist, allow: []string{"ls *"}, args: `{"command": ["lsblk"]}`,
			wantApproval: policy(config.PolicyAllowlist, job.DecisionDenied)},
		// argv[0] "ls /../../bin/sh" is /bin/sh through a folder "ls " write_file can make.
		{name: "allowlist program holding a space", policy: config.PolicyAllowlist, allow: []string{"ls *"}, args: `{"command": ["ls /../../bin/sh", "-c", "id"]}`,
			wantApproval: policy(config.PolicyAllowlist, job.DecisionDenied)},
		{name: "ask approved", policy: config.PolicyAsk, approver: yes, args: `{"command": ["make", "test"]}`, wantArgv: []string{"make", "test"},
			wantApproval: &job.Approval{Policy: config.PolicyAsk, Decision: job.DecisionApproved, DecidedBy: "alice@host", DecidedAt: decidedAt}},
		{name: "ask denied", policy: config.PolicyAsk, approver: no, args: `{"command": ["make", "test"]}`,
			wantApproval: &job.Approval{Policy: config.PolicyAsk, Decision: job.DecisionDenied, DecidedBy: "bob@host", DecidedAt: decidedAt}},
		{name: "ask without an approver", policy: config.PolicyAsk, args: `{"command": ["make", "test"]}`,
			wantApproval: policy(config.PolicyAsk, job.DecisionDenied)},
		{name: "ask with a failing approver", policy: config.PolicyAsk, approver: broken, args: `{"command": ["make", "test"]}`,
			wantApproval: &job.Approval{Policy: config.PolicyAsk, Decision: job.DecisionDenied}, waitEnded: true},
		{name: "ask unanswered in time", policy: config.PolicyAsk, approver: silent, args: `{"command": ["make", "test"]}`,
			wantApproval: &job.Approval{Policy: config.PolicyAsk, Decision: job.DecisionTimedOut}, waitEnded: true},
		{name: "ask expired by the transport", policy: config.PolicyAsk, approver: expired, args: `{"command": ["make", "test"]}`,
			wantApproval: &job.Approval{Policy: config.PolicyAsk, Decision: job.DecisionTimedOut, DecidedAt: decidedAt}},
		{name: "empty command", policy: config.PolicyAllowlist, allow: []string{"*"}, args: `{"command": []}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			asked = nil
			s := newScript(t, toolCalls(100, call{"sh1", "shell", tt.args}), final("ok"))
			p := csvProfile(t, config.Tool{Name: "shell", Kind: config.ToolShell, Policy: tt.policy, Allow: tt.allow})
			p.Limits.ApprovalTimeout = config.Duration(50 * time.Millisecond)
			sb := newFakeSandbox(nil)
			req := request(p, sb)
			req.Approver = tt.approver
			res, err := newAgent(t, s).Run(context.Background(), req)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			got := res.ToolCalls[0].Approval
			if got != nil && tt.waitEnded {
				if got.DecidedAt.IsZero() {
					t.Errorf("approval.At is zero, want when the wait ended")
				}
				c := *got
				c.DecidedAt = time.Time{}
				got = &c
			}
			if !reflect.DeepEqual(got, tt.wantApproval) {
				t.Errorf("approval = %+v, want %+v", got, tt.wantApproval)
			}
			argvs := sb.argvs()
			result := lastToolResult(t, s.requests()[1])
			if tt.wantArgv == nil {
				if msg, _ := result["error"].(string); len(argvs) != 0 || msg == "" {
					t.Errorf("execs %q, result %v; want nothing run and an error", argvs, result)
				}
				return
			}
			if len(argvs) != 1 || !reflect.DeepEqual(argvs[0], tt.wantArgv) {
				t.Errorf("execs = %q, want %q", argvs, tt.wantArgv)
			}
			if _, ok := result["exit_code"]; !ok || res.ToolCalls[0].Error != "" {
				t.Errorf("result %v, want a command result", result)
			}
			if tt.policy == config.PolicyAsk {
				want := []agent.ApprovalRequest{{JobID: req.JobID, CallID: "sh1", Argv: tt.wantArgv}}
				if !reflect.DeepEqual(asked, want) {
					t.Errorf("approval requests = %+v, want %+v", asked, want)
				}
			}
		})
	}
}
