package job

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"time"
)

// State is where a job is in its life.
type State string

// The states a job passes through. Terminal states never change again.
const (
	StateQueued          State = "queued"
	StateRunning         State = "running"
	StateWaitingApproval State = "waiting_approval"
	StateInterrupted     State = "interrupted" // the worker stopped; the job will be redelivered
	StateRetrying        State = "retrying"    // a transient fault; the job will be redelivered
	StateSucceeded       State = "succeeded"
	StateCapped          State = "capped"
	StateFailed          State = "failed"
	StateRejected        State = "rejected"
	StateCancelled       State = "cancelled"
	StateDead            State = "dead"
)

// Terminal reports whether no further change can happen to a job in this state.
func (s State) Terminal() bool {
	switch s {
	case StateSucceeded, StateCapped, StateFailed, StateRejected, StateCancelled, StateDead:
		return true
	}
	return false
}

// Status is what the system knows about a job, kept in the status bucket under the job id.
type Status struct {
	ID      string `json:"id"`
	State   State  `json:"state"`
	Profile string `json:"profile,omitempty"`
	// Labels are the job's, copied when it is queued, so `submit list --label` needs no store.
	Labels    map[string]string `json:"labels,omitempty"`
	Attempt   int               `json:"attempt,omitempty"`
	Worker    string            `json:"worker,omitempty"`
	Progress  string            `json:"progress,omitempty"`
	ToolCalls int               `json:"tool_calls,omitempty"`
	MaxCalls  int               `json:"max_tool_calls,omitempty"`
	Cap       string            `json:"cap,omitempty"`
	Error     string            `json:"error,omitempty"`
	// SpentTurns, SpentToolCalls and SpentTokens are what all attempts of the job have used of
	// its caps so far, recorded with every progress update; a redelivered attempt starts from
	// them, never from zero.
	SpentTurns     int   `json:"spent_turns,omitempty"`
	SpentToolCalls int   `json:"spent_tool_calls,omitempty"`
	SpentTokens    int64 `json:"spent_tokens,omitempty"`
	// CancelRequested asks the worker running the job to stop it; see RequestCancel.
	CancelRequested bool `json:"cancel_requested,omitempty"`
	// HandedBack counts the deliveries that handed the job to a peer whose config could take
	// it (a fleet mid-rollout): they do not count against the max_deliver that bounds its
	// runs, and are bounded by it on their own (see the runner's leaveToPeer).
	HandedBack int `json:"handed_back,omitempty"`
	// Ending is the end a delivery that never ran the job (refused at admit, exhausted) has
	// claimed and is committing, as a claim's running does for a run: a cancel asked after it
	// only marks CancelRequested (RequestCancel), so that the end decided first is the one
	// recorded. A new attempt's claim, and the end's own write, clear it.
	Ending State `json:"ending,omitempty"`
	// Asked is, by call id, each approval request the job's attempts asked a person, as the
	// worker wrote it in the approvals bucket. A tenant's approver may write that bucket, this
	// status only workers: a redelivered attempt trusts an earlier answer only when it is
	// signed for the request recorded here, and never one the worker stopped waiting for.
	// It holds at most MaxAsked requests (RecordAsked).
	Asked    map[string]Asked `json:"asked,omitempty"`
	Report   string           `json:"report,omitempty"`   // store key of the report
	Manifest string           `json:"manifest,omitempty"` // store key of the manifest
	// Unsigned marks a committed run adopted without its signature in place: the store refused
	// the adopting worker's copy of the envelope its attempt left, so `submit verify` finds
	// none until a worker the store takes adopts it again.
	Unsigned bool `json:"unsigned,omitempty"`
	// SandboxClaimedAt is when the running attempt had its sandbox, and SandboxWarm says it
	// was started ahead of the job (a warm pool's) rather than for it.
	SandboxClaimedAt time.Time `json:"sandbox_claimed_at,omitzero"`
	SandboxWarm      bool      `json:"sandbox_warm,omitempty"`
	QueuedAt         time.Time `json:"queued_at,omitzero"`
	StartedAt        time.Time `json:"started_at,omitzero"`
	FinishedAt       time.Time `json:"finished_at,omitzero"`
	UpdatedAt        time.Time `json:"updated_at,omitzero"`
}

// Asked is one approval request as its worker wrote it: the approvals bucket's revision of it
// and its expiry, what a person's signed answer must name, and whether the worker gave up
// waiting for the answer (Expired), after which no answer to it counts.
type Asked struct {
	Revision  uint64    `json:"revision"`
	ExpiresAt time.Time `json:"expires_at"`
	Expired   bool      `json:"expired,omitempty"`
}

// MaxAsked bounds Status.Asked, whatever max_tool_calls allows (up to 16384 "ask" calls): the
// status is a NATS message, refused past the server's max_payload (1 MiB by default), and an
// entry is up to about 220 bytes (a call id of 128 characters), so 256 take at most 56 KiB.
const MaxAsked = 256

// RecordAsked records call's request as its worker asked it. Past MaxAsked requests it first
// forgets those the worker stopped waiting for (no answer to them counts, recorded or not),
// then the oldest asked (the lowest revision of the job's tenant's approvals bucket): a later
// attempt that asks one of those again is refused its earlier answer, which fails safe (the
// command does not run, and the model is told why).
func (s *Status) RecordAsked(callID string, a Asked) {
	if s.Asked == nil {
		s.Asked = map[string]Asked{}
	}
	delete(s.Asked, callID)
	if over := len(s.Asked) - (MaxAsked - 1); over > 0 {
		ids := slices.Collect(maps.Keys(s.Asked))
		slices.SortFunc(ids, func(x, y string) int { return forgetFirst(s.Asked[x], s.Asked[y], x, y) })
		for _, id := range ids[:over] {
			delete(s.Asked, id)
		}
	}
	s.Asked[callID] = a
}

// Clone returns a copy of s that shares no map with it: a change of one (RecordAsked, a
// label) leaves the other as it was.
func (s Status) Clone() Status {
	s.Labels, s.Asked = maps.Clone(s.Labels), maps.Clone(s.Asked)
	return s
}

// forgetFirst orders requests by which RecordAsked forgets first: those the worker stopped
// waiting for, then the oldest asked; the call id settles ties.
func forgetFirst(x, y Asked, xid, yid string) int {
	if x.Expired != y.Expired {
		if x.Expired {
			return -1
		}
		return 1
	}
	if c := cmp.Compare(x.Revision, y.Revision); c != 0 {
		return c
	}
	return strings.Compare(xid, yid)
}

// ClearAttempt empties what the status says of one attempt alone, for a new attempt to write
// its own: its progress, error and cap, its sandbox (SandboxClaimedAt, SandboxWarm) and its end
// (FinishedAt, Ending). Otherwise a redelivered attempt still starting its sandbox shows the one
// before's. The new attempt writes State, Attempt, Worker, StartedAt and MaxCalls itself.
// What all attempts share stays: the job's identity, labels and queue time, the budget spent
// (Spent*, and ToolCalls with them), a cancel request, the approval requests asked, and the
// report and manifest (written once, by the commit that ends the job).
func (s *Status) ClearAttempt() {
	s.Progress, s.Error, s.Cap = "", "", ""
	s.SandboxClaimedAt, s.SandboxWarm = time.Time{}, false
	s.FinishedAt = time.Time{}
	s.Ending = ""
}

// RequestCancel is the status change behind `submit cancel`: a job that has not started is
// cancelled at once (no worker will start it); a running one is asked to stop, and so is one
// whose end a delivery claimed (Ending): that end was decided before the cancel was asked.
func RequestCancel(s *Status) {
	switch {
	case s.Ending != "":
		s.CancelRequested = true
	case s.State == "", s.State == StateQueued, s.State == StateRetrying, s.State == StateInterrupted:
		now := time.Now().UTC()
		s.State, s.FinishedAt, s.Progress = StateCancelled, now, ""
		s.Error = "cancelled before it started"
	default:
		s.CancelRequested = true
	}
}
