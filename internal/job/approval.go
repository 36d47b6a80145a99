package job

import "time"

// Decision is how a shell command under an approval policy was decided. One vocabulary serves
// the approvals bucket (a person's answer), the agent (what the policy let run) and the
// manifest (the record of both). Only DecisionApproved lets the command run.
type Decision string

// Decisions.
const (
	DecisionApproved Decision = "approved"
	DecisionDenied   Decision = "denied"
	// DecisionTimedOut: under "ask", nobody answered within the approval timeout.
	DecisionTimedOut Decision = "timed_out"
	// DecisionExpired marks a request in the approvals bucket that the worker stopped waiting
	// for (its timeout passed or the job ended) before anyone answered; the command was
	// denied, and the run records DecisionTimedOut.
	DecisionExpired Decision = "expired"
	// DecisionRefused: under "ask", an answer came that the worker could not trust (unsigned,
	// signed by no trusted approver key, for another request or command, or too late); the
	// command was not run.
	DecisionRefused Decision = "refused"
)

// Approval records who or what let a shell command run or refused it, so that a reader can
// tell the commands a person let through (Policy ask, Decision approved, DecidedBy set) from
// those the profile's policy decided (Policy allowlist or deny, no DecidedBy).
type Approval struct {
	// Policy is the profile's: config.PolicyDeny, PolicyAllowlist or PolicyAsk.
	Policy string `json:"policy"`
	// Decision is DecisionApproved, DecisionDenied, DecisionTimedOut or DecisionRefused.
	Decision Decision `json:"decision"`
	// DecidedBy is the name, in the worker's approver keyring, of the key that signed the
	// answer under "ask"; empty for policy decisions, timeouts and refused answers.
	DecidedBy string `json:"decided_by,omitempty"`
	// DecidedAt is when the person answered or the wait for one ended (UTC in a manifest);
	// zero for policy decisions, which take no time worth recording.
	DecidedAt time.Time `json:"decided_at,omitzero"`
	// Refused says why the worker refused an answer (DecisionRefused).
	Refused string `json:"refused,omitempty"`
}
