package runner

import (
	"errors"
	"fmt"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/redact"
	"github.com/boxcar-run/boxcar/internal/textcut"
)

// ending is how one attempt of a job ended, as far as the queue and the status care.
type ending int

const (
	// endSucceeded: the agent finished the task.
	endSucceeded ending = iota + 1
	// endCapped: a cap (outcome.cap) stopped the agent.
	endCapped
	// endFailed: a fault of the job that retrying cannot fix (bad input, a model that refuses
	// the request, a report too large); outcome.err is a queue.Permanent with the reason.
	endFailed
	// endRejected: the message is not a job this worker can run (not a job, an id that does
	// not match, an unknown profile); outcome.err is a queue.Permanent with the reason.
	endRejected
	// endTransient: a fault worth retrying (store, NATS, sandbox, model unavailable).
	endTransient
	// endCancelled: someone asked for the job to be cancelled.
	endCancelled
	// endInterrupted: the worker is shutting down; the job goes back to the queue at once.
	endInterrupted
	// endDone: the job had already ended (another attempt committed it, or its status is
	// final); this delivery has nothing to add.
	endDone
	// endLeaseLost: a later attempt took the job over while this one worked (its ack
	// deadline passed); this attempt's result is discarded.
	endLeaseLost
	// endDeadLetter: the job's end is committed as failed, rejected or dead (by another
	// attempt, or by this delivery); this delivery makes sure its one dead letter exists.
	// outcome.err is a queue.Permanent with the reason.
	endDeadLetter
	// endUndecided: the job's end cannot be decided now (the store did not answer whether a
	// run is committed); deliver it again later, recording nothing.
	endUndecided
	// endLeftToPeer: this worker's config cannot take the job, and a live worker's may
	// (leaveToPeer); deliver it again later, recording no failure.
	endLeftToPeer
	// endPanickedInEnd: the commit of the job's end panicked (a bug in the worker); deliver it
	// again later, recording nothing, while it has deliveries left; its last ends it failed,
	// worker_panicked, with no manifest (none could be written). outcome.err is a
	// queue.Permanent with that reason.
	endPanickedInEnd
)

var endingNames = map[ending]string{
	endSucceeded: "succeeded", endCapped: "capped", endFailed: "failed", endRejected: "rejected",
	endTransient: "transient", endCancelled: "cancelled", endInterrupted: "interrupted",
	endDone: "done", endLeaseLost: "lease_lost", endDeadLetter: "dead_letter", endUndecided: "undecided",
	endLeftToPeer: "left_to_peer", endPanickedInEnd: "panicked_in_end",
}

func (e ending) String() string { return endingNames[e] }

// outcome is what one attempt produced: how it ended and why.
type outcome struct {
	end ending
	// err says why the attempt did not succeed; a queue.Permanent carries the dead letter's
	// reason and a queue.RetryAfter the delay before the next delivery.
	err error
	// cap names the limit that stopped a capped run (agent.Cap*).
	cap string
	// committed: this attempt wrote the run's manifest, so the status points at the run.
	committed bool
	// state is what the committed manifest records, for endDone and endDeadLetter of a job
	// whose end this delivery committed (committed is set): counted in boxcar_jobs_total.
	state job.State
}

// withDroppedReport is the outcome of a run whose report had to be left out (dropped is nil
// when it was not). A run that would have succeeded or been capped fails with that error, as
// nothing else went wrong and the report is what a user asked for; a run that already failed,
// died or was cancelled keeps its own cause, which came first.
func (o outcome) withDroppedReport(dropped error) outcome {
	if dropped == nil || (o.end != endSucceeded && o.end != endCapped) {
		return o
	}
	return outcome{end: endFailed, err: dropped, cap: o.cap}
}

// queueAction is what the runner tells the queue about a delivery.
type queueAction int

const (
	// ackJob: the job is done; never deliver it again.
	ackJob queueAction = iota + 1
	// nakNow: hand the job back for another worker at once.
	nakNow
	// nakLater: deliver the job again after a backoff (or the queue.RetryAfter delay).
	nakLater
	// termJob: stop all deliveries and keep the job in the dead-letter stream.
	termJob
	// leaveJob: tell the queue nothing. A later delivery of the job is in flight and owns its
	// end; the server acks a message, not a delivery, so acking this one would end that one too.
	leaveJob
)

var actionNames = map[queueAction]string{ackJob: "ack", nakNow: "nak-now", nakLater: "nak", termJob: "term", leaveJob: "leave"}

func (a queueAction) String() string { return actionNames[a] }

// decision is everything an outcome means: for the queue, the status and the metrics.
type decision struct {
	action queueAction
	// state is the status to record; empty records nothing (the job ended elsewhere). A
	// terminal state is also the outcome a committed manifest records, and is counted in
	// boxcar_jobs_total.
	state job.State
	// reason is the machine-readable reason a dead letter and a failed or dead manifest carry.
	reason string
	// capHit names the cap to count in boxcar_cap_hits_total; empty counts nothing.
	capHit string
	// stale counts boxcar_stale_attempts_total.
	stale bool
	// ended is the terminal state of a job this delivery ended by committing its manifest
	// while the status follows that manifest (state is empty): counted like state.
	ended job.State
	// waiting keeps the status's state (state is empty) and says in its progress why the job
	// waits for another delivery: a user watching it sees the fault, not the last step.
	waiting bool
}

// counted is the terminal state this delivery counts in boxcar_jobs_total, or "".
func (d decision) counted() job.State {
	if d.state.Terminal() {
		return d.state
	}
	return d.ended
}

// decide maps an attempt's outcome, and whether the queue will deliver the job again after
// this delivery (last is true when it will not), to what happens next. It is the only place
// where a job's fate is decided.
func decide(o outcome, last bool) decision {
	switch o.end {
	case endSucceeded:
		return decision{action: ackJob, state: job.StateSucceeded}
	case endCapped:
		return decision{action: ackJob, state: job.StateCapped, capHit: o.cap}
	case endFailed:
		return decision{action: termJob, state: job.StateFailed, reason: permanentReason(o.err, "failed")}
	case endRejected:
		return decision{action: termJob, state: job.StateRejected, reason: permanentReason(o.err, "rejected")}
	case endTransient:
		return onLast(last, decision{action: termJob, state: job.StateDead, reason: "max_deliveries"}, decision{action: nakLater, state: job.StateRetrying})
	case endCancelled:
		return decision{action: ackJob, state: job.StateCancelled}
	case endInterrupted:
		// Even on the last delivery: the delivery after it ends the job (see exhausted).
		return decision{action: nakNow, state: job.StateInterrupted}
	case endLeaseLost:
		// If the run is committed instead, its next delivery finds the manifest and acks.
		return decision{action: leaveJob, stale: true}
	case endDone:
		d := decision{action: ackJob}
		if o.committed {
			d.ended = o.state
		}
		return d
	case endDeadLetter:
		// The status already says so: it follows the committed manifest.
		d := decision{action: termJob, reason: permanentReason(o.err, "max_deliveries")}
		if o.committed {
			d.ended = o.state
		}
		return d
	case endPanickedInEnd:
		// A panic of one worker's state may pass on the next delivery; one that recurs to the
		// last would cycle through every worker for ever (an exhausted delivery commits its end
		// too), so that one ends the job without the manifest it cannot write.
		return onLast(last, decision{action: termJob, state: job.StateFailed, reason: permanentReason(o.err, "worker_panicked")}, decision{action: nakLater, waiting: true})
	case endUndecided, endLeftToPeer:
		// Not retrying: the run may be committed, and a status that said so would let a
		// cancel end it before its next delivery adopts that run; a job left to a peer met no
		// fault. Never on the last delivery for endLeftToPeer: leaveToPeer ends the job there.
		return decision{action: nakLater, waiting: true}
	}
	// An outcome nobody built: keep the job, and say so in its status.
	return decision{action: nakLater, state: job.StateRetrying}
}

// onLast is final on the job's last delivery, else again.
func onLast(last bool, final, again decision) decision {
	if last {
		return final
	}
	return again
}

// permanentReason is the reason a queue.Permanent error carries, else def.
func permanentReason(err error, def string) string {
	var perm *queue.PermanentError
	if errors.As(err, &perm) && perm.Reason != "" {
		return perm.Reason
	}
	return def
}

// errLeaseLost means a later attempt of the job started, or committed the run, while this one
// worked: this attempt must not write anything more.
var errLeaseLost = errors.New("lease lost: a later attempt of the job took it over")

// maxErrorText bounds the text of an error wherever the runner records it: the job's status
// and its dead letter (NATS messages, which the server refuses past its max_payload, 1 MiB by
// default: the job would never end), the manifest, report.md and the log line of the
// settling. An error may quote what others said at any length: a model endpoint, a store.
const maxErrorText = 4 << 10

// errorText is err's text as the runner records it for the job's tenant to read (its status,
// manifest, report.md, dead letter, an end's transcript line): the words tenantWords gives for
// it, never the words of the sandbox, the cluster or the store, which name the worker's host
// (the worker's log has those, with the job's id and tenant); in a text that is the tenant's own,
// no address (redact.Addresses: a store's or NATS's URL and host:port); at most maxErrorText
// bytes, its head kept and what was cut counted. Every sink of an attempt's error but the log
// goes through it.
func errorText(err error) string {
	s, own := tenantText(err)
	if !own {
		return s
	}
	// Addresses reads no more than can be kept: an error may quote megabytes.
	head := textcut.Head(s, 2*maxErrorText)
	return bounded(redact.Addresses(head), len(s)-len(head))
}

// logText is err's text as the worker's log has it: whole, but bounded as errorText is.
func logText(err error) string { return bounded(err.Error(), 0) }

// bounded is s cut to at most maxErrorText bytes on a rune boundary, what was cut counted
// with more, the bytes already cut from its end before.
func bounded(s string, more int) string {
	if len(s) <= maxErrorText && more == 0 {
		return s
	}
	keep := min(len(s), maxErrorText-32) // the marker's room
	if more > 0 {
		keep = max(min(keep, len(s)-256), 0) // never the end of s, which may end in half an address
	}
	kept := textcut.Head(s, keep)
	return fmt.Sprintf("%s…[%d bytes cut]", kept, len(s)-len(kept)+more)
}

// boundedError is err with its text cut as errorText cuts it, for a sink that takes an error
// (the dead letter); nil stays nil.
func boundedError(err error) error {
	if err == nil {
		return nil
	}
	return errors.New(errorText(err))
}
