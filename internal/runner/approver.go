package runner

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/approvalsig"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/textcut"
)

// Approvals is the transport of the shell tool's "ask" approvals.
type Approvals interface {
	RequestApproval(ctx context.Context, a queue.Approval) (queue.Approval, error)
	WaitApproval(ctx context.Context, r queue.Ref, callID string) (queue.Approval, error)
	ExpireApproval(ctx context.Context, r queue.Ref, callID, reason string) (queue.Approval, error)
}

var _ Approvals = (*queue.Consumer)(nil)

// approver asks a person, through the approvals transport, whether a shell command of one
// attempt may run. While it waits, the job is waiting_approval and its delivery stays alive
// through the attempt's heartbeats; the agent bounds the wait by the profile's approval
// timeout, and the request's expiry bounds it across the job's deliveries. No answer means
// denied, and the request is then marked expired so that a late answer is refused. A job
// handed back to the queue while it waits (handedBack) leaves the request pending: its next
// delivery, asking for the same command under the same call id, waits on that same request.
type approver struct {
	r *Runner
	a *attempt
}

var _ agent.Approver = (*approver)(nil)

// handedBack are the causes of an attempt's end that give the job to another delivery: a
// worker shutting down, a later delivery holding the job. The request asked stays pending for
// that delivery. Any other end (a cancel, the job's timeout, a panic) expires it.
var handedBack = []error{errShutdown, errLeaseLost}

// approver returns the Approver of an attempt: nil, which refuses every "ask" command, when
// the runner has no approvals transport.
func (r *Runner) approver(a *attempt) agent.Approver {
	if r.cfg.Approvals == nil {
		return nil
	}
	return &approver{r: r, a: a}
}

func (p *approver) Approve(ctx context.Context, req agent.ApprovalRequest) (agent.Answer, error) {
	st, err := p.r.cfg.Queue.Status(ctx, p.a.ref(req.JobID))
	if err != nil {
		return agent.Answer{}, fmt.Errorf("read the job's record of the approvals asked for call %s: %w", req.CallID, err)
	}
	rec, recorded := st.Asked[req.CallID]
	asked, err := p.ask(ctx, req, rec)
	if err != nil {
		return agent.Answer{}, err
	}
	if asked.Decision != "" {
		// An earlier attempt of the job asked about this very command.
		p.a.log.InfoContext(ctx, "approval answered before", "call_id", req.CallID, "decision", asked.Decision)
		return p.reused(ctx, asked, req, rec, recorded)
	}
	return p.wait(ctx, req, asked)
}

// ask writes the request, or goes on with the one an earlier delivery of the job asked and
// left pending when it was handed back (rec, as the job's status records it, unless the worker
// stopped waiting for it): the same revision and expiry, which any answer given meanwhile, or
// later, is signed for.
func (p *approver) ask(ctx context.Context, req agent.ApprovalRequest, rec job.Asked) (queue.Approval, error) {
	now := time.Now().UTC()
	expires := now.Add(time.Duration(p.a.limits.ApprovalTimeout))
	if dl, ok := ctx.Deadline(); ok && dl.Before(expires) {
		expires = dl.UTC()
	}
	a := queue.Approval{
		Tenant: p.a.d.Tenant, JobID: req.JobID, CallID: req.CallID, Argv: req.Argv, Attempt: p.a.d.Attempt,
		Worker: p.r.cfg.Worker.WorkerID, RequestedAt: now, ExpiresAt: expires,
	}
	if !rec.Expired {
		a.Revision = rec.Revision
	}
	return p.r.cfg.Approvals.RequestApproval(ctx, a)
}

// wait waits for the answer to the request asked, pending, until its expiry.
func (p *approver) wait(ctx context.Context, req agent.ApprovalRequest, asked queue.Approval) (agent.Answer, error) {
	log := p.a.log.With("call_id", req.CallID)
	log.InfoContext(ctx, "waiting for approval", "expires_at", asked.ExpiresAt, "revision", asked.Revision, "attempt_asked", asked.Attempt)
	p.setState(ctx, job.StateWaitingApproval, waitingMessage(req, p.a.d.Tenant, asked.Revision, asked.ExpiresAt), recordAsked(asked))

	// Whatever happens, leave the job running again, also when the wait ended with the job.
	cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.r.cfg.CleanupTimeout)
	defer cancel()
	wctx, stop := context.WithDeadline(ctx, asked.ExpiresAt)
	defer stop()
	got, err := p.r.cfg.Approvals.WaitApproval(wctx, p.a.ref(req.JobID), req.CallID)
	if err != nil {
		if wctx.Err() != nil {
			err = wctx.Err() // the wait's end, not how the watch took it
		}
		var answered bool
		if got, answered, err = p.stopped(ctx, cleanup, req, asked, err); !answered {
			return agent.Answer{At: got.DecidedAt}, err
		}
	}
	log.InfoContext(ctx, "approval answered", "decision", got.Decision, "wait_ms", time.Since(asked.RequestedAt).Milliseconds())
	ans, err := p.trusted(cleanup, got, approvalsig.Request{Tenant: p.a.d.Tenant, JobID: req.JobID, CallID: req.CallID, Argv: req.Argv, Revision: asked.Revision, ExpiresAt: asked.ExpiresAt})
	switch {
	case ans.Refused != "":
		p.setState(cleanup, job.StateRunning, fmt.Sprintf("call %s: answer refused: %s", req.CallID, ans.Refused), nil)
	case err == nil:
		p.setState(cleanup, job.StateRunning, fmt.Sprintf("call %s %s by %s", req.CallID, got.Decision, ans.By), nil)
	}
	return ans, err
}

// stopped ends a wait that ended with werr and no answer. A job handed back to the queue
// leaves the request pending, for its next delivery. Otherwise the request is marked expired,
// unless a person answered just before (answered: got is the answer).
func (p *approver) stopped(ctx, cleanup context.Context, req agent.ApprovalRequest, asked queue.Approval, werr error) (got queue.Approval, answered bool, err error) {
	log := p.a.log.With("call_id", req.CallID)
	cause := context.Cause(ctx)
	if slices.ContainsFunc(handedBack, func(e error) bool { return errors.Is(cause, e) }) {
		log.InfoContext(ctx, "approval left pending for the job's next delivery", "reason", errorText(cause), "expires_at", asked.ExpiresAt)
		return queue.Approval{DecidedAt: time.Now().UTC()}, false, werr
	}
	reason := "no answer within " + roughly(asked.ExpiresAt.Sub(asked.RequestedAt))
	if !errors.Is(werr, context.DeadlineExceeded) {
		why := werr
		if cause != nil {
			why = cause // the job's words (cancelled), not the watch's
		}
		reason = "the job stopped waiting: " + errorText(why)
	}
	final, xerr := p.r.cfg.Approvals.ExpireApproval(cleanup, p.a.ref(req.JobID), req.CallID, reason)
	if xerr != nil || final.Decision == job.DecisionExpired {
		if xerr != nil {
			log.WarnContext(ctx, "mark approval expired failed", "error", xerr)
		}
		log.InfoContext(ctx, "no approval", "reason", reason)
		p.setState(cleanup, job.StateRunning, "no approval for call "+req.CallID+": "+reason, recordExpired(req.CallID))
		return final, false, werr
	}
	return final, true, nil // a person answered just before the worker gave up
}

// recordAsked records the request as the worker asked it, for the job's later attempts
// (job.Status.Asked), within its bound (job.MaxAsked).
func recordAsked(asked queue.Approval) func(*job.Status) {
	return func(s *job.Status) {
		s.RecordAsked(asked.CallID, job.Asked{Revision: asked.Revision, ExpiresAt: asked.ExpiresAt})
	}
}

// recordExpired records that the worker stopped waiting for the answer to call's request: no
// later answer to it counts.
func recordExpired(callID string) func(*job.Status) {
	return func(s *job.Status) {
		if rec, ok := s.Asked[callID]; ok {
			rec.Expired = true
			s.Asked[callID] = rec
		}
	}
}

// leaveAsked marks expired, in the status of a job that ends, the requests it records asked
// and neither expired nor past their expiry, and returns their call ids: a delivery handed
// the job back leaving them pending (handedBack), and none waits on them now.
func leaveAsked(s *job.Status, now time.Time) []string {
	var left []string
	for id, rec := range s.Asked {
		if !rec.Expired && rec.ExpiresAt.After(now) {
			left = append(left, id)
			recordExpired(id)(s)
		}
	}
	return left
}

// expireLeftAsked marks expired in the approvals bucket the requests the job's end left
// pending (a.leftAsked: leaveAsked in the end's terminal status write, recordState or
// adoptCommitted; settle drops them when that write found a later delivery holding the job).
func (r *Runner) expireLeftAsked(w settler, dec decision) {
	a := w.a
	expireLeft(w.cleanup, r.cfg.Approvals, a.ref(a.job.ID), a.leftAsked, cmp.Or(dec.state, dec.ended), a.log)
}

// expireLeft marks expired in the approvals bucket (nil: none) the requests ids of the job r,
// which ended (state, "" when unknown) with them left pending (leaveAsked), so that an answer
// to one is refused, not recorded for a command nothing will run. A request answered already
// keeps its answer.
func expireLeft(ctx context.Context, approvals Approvals, r queue.Ref, ids []string, state job.State, log *slog.Logger) {
	if approvals == nil {
		return
	}
	reason := "the job ended without waiting for it"
	if state != "" {
		reason = "the job ended " + string(state) + " without waiting for it"
	}
	for _, id := range ids {
		if _, err := approvals.ExpireApproval(ctx, r, id, reason); err != nil {
			log.WarnContext(ctx, "mark approval expired failed", "job_id", r.ID, "call_id", id, "error", err)
		}
	}
}

// reused is the answer an earlier attempt's request under the same call got, for the same
// command, if it answers that request as its worker recorded it in the job's status
// (job.Status.Asked), which only workers write: signed for that revision and expiry, and not
// one the worker stopped waiting for. The approvals bucket cannot tell: a writer of the
// tenant's approvals (its approver's login, which signs nothing) can put a request back as
// pending, with an expiry of its own, once the worker gave up on it or once it was denied, and
// a person's signed answer to that would answer a request no worker asked.
func (p *approver) reused(ctx context.Context, got queue.Approval, req agent.ApprovalRequest, rec job.Asked, ok bool) (agent.Answer, error) {
	switch {
	case !ok || rec.Revision == 0:
		return p.refused(ctx, got, fmt.Errorf("%w: no attempt of the job recorded asking it (its status keeps the last %d asked)", approvalsig.ErrMismatch, job.MaxAsked)), nil
	case rec.Expired:
		return p.refused(ctx, got, fmt.Errorf("%w: an earlier attempt stopped waiting for it at %s", approvalsig.ErrExpired, rec.ExpiresAt.Format(time.RFC3339))), nil
	default:
		return p.trusted(ctx, got, approvalsig.Request{Tenant: p.a.d.Tenant, JobID: req.JobID, CallID: req.CallID, Argv: req.Argv,
			Revision: rec.Revision, ExpiresAt: rec.ExpiresAt})
	}
}

// trusted turns an answer from the bucket into the agent's, through its signature only: the
// decision, the reason and who decided are what the trusted key signed, never what the entry
// claims. An answer expired by the worker needs no signature; it lets nothing run.
func (p *approver) trusted(ctx context.Context, a queue.Approval, req approvalsig.Request) (agent.Answer, error) {
	if a.Decision == job.DecisionExpired {
		return answer(a)
	}
	s, key, err := approvalsig.Check(a.Signed, req, p.r.cfg.ApproverKeys)
	if err != nil {
		return p.refused(ctx, a, err), nil
	}
	a.Decision, a.Reason, a.DecidedAt, a.DecidedBy = s.Decision, s.Reason, s.DecidedAt, key.Name
	return answer(a)
}

// refused is the agent's answer to an answer the worker does not trust: the command does not
// run, and the model is told why.
func (p *approver) refused(ctx context.Context, a queue.Approval, why error) agent.Answer {
	p.a.log.WarnContext(ctx, "approval answer refused; the command does not run", "call_id", a.CallID, "error", why,
		"claimed_decided_by", a.DecidedBy)
	return agent.Answer{Refused: why.Error(), At: time.Now().UTC()}
}

// answer turns a decision into what the agent expects of an Approver: who decided and when go
// with it into the run's manifest.
func answer(a queue.Approval) (agent.Answer, error) {
	switch a.Decision {
	case job.DecisionApproved:
		return agent.Answer{Approved: true, By: a.DecidedBy, At: a.DecidedAt}, nil
	case job.DecisionDenied:
		return agent.Answer{By: a.DecidedBy, At: a.DecidedAt, Reason: a.Reason}, nil
	default:
		// Expired by another attempt of the job (one whose lease passed) while this one
		// waited: nobody answered in time.
		return agent.Answer{At: a.DecidedAt}, fmt.Errorf("approval of call %s %s: %s: %w", a.CallID, a.Decision, a.Reason, context.DeadlineExceeded)
	}
}

// setState moves the job between running and waiting_approval, with record's change of what
// the status records of the request (nil: none). A failure is logged only: the request is in
// the approvals bucket either way, and an answer to one the status does not record is refused
// to a later attempt (reused), never trusted.
func (p *approver) setState(ctx context.Context, state job.State, msg string, record func(*job.Status)) {
	_, err := p.r.writeStatus(ctx, p.a, p.a.job.ID, func(s *job.Status) {
		if s.State == job.StateRunning || s.State == job.StateWaitingApproval {
			s.State = state
		}
		s.Progress = msg
		if record != nil {
			record(s)
		}
	})
	if err != nil && !errors.Is(err, queue.ErrFinal) && !errors.Is(err, errLeaseLost) && ctx.Err() == nil {
		p.a.log.WarnContext(ctx, "record approval state failed", "state", string(state), "error", err)
	}
}

// waitingMessage is the progress line of a job waiting for a person: the command, unambiguous,
// and how to answer it, bound to the revision of the request asked (the status bucket is the
// workers' alone, so the line says what this worker asked).
func waitingMessage(req agent.ApprovalRequest, tenant string, rev uint64, expires time.Time) string {
	argv, _ := json.Marshal(req.Argv)
	cmd := string(argv)
	if len(cmd) > 200 {
		cmd = textcut.Head(cmd, 200) + "…" // json.Marshal's text is valid UTF-8
	}
	args := fmt.Sprintf("%s %s --revision %d", req.JobID, req.CallID, rev)
	if tenant != "" && tenant != job.DefaultTenant {
		args += " --tenant " + tenant // the approvals key is the tenant's
	}
	return fmt.Sprintf("waiting until %s for approval of call %s: %s; answer with `submit approve %s` or `submit deny %s`",
		expires.Format(time.RFC3339), req.CallID, cmd, args, args)
}

// roughly rounds d for people: to the second, below a second to 10ms.
func roughly(d time.Duration) string {
	if d >= time.Second {
		return d.Round(time.Second).String()
	}
	return d.Round(10 * time.Millisecond).String()
}
