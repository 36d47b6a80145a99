package sandbox

import "context"

// Claimer is a sandbox started ahead of its job (Spec.Pool) that can be bound to one. What is
// job-specific reaches a sandbox after Claim in every case, warm or cold: inputs are written
// in, each Exec carries its environment, and egress is attached (Egress) after the claim, so
// a claimed sandbox and one started for its job are alike to the job.
type Claimer interface {
	// Claim binds the sandbox to tenant's job jobID: its Lifetime counts from now, and its
	// name, labels and logs say the job and its tenant, as those of a sandbox started for the
	// job do (Spec.JobID, Spec.Tenant), so that a reaper judges it as it judges those. It fails
	// (wrapping ErrClosed) for a sandbox that ended while it waited; the caller closes that one
	// and starts another.
	Claim(ctx context.Context, tenant, jobID string) error
}

// Warmer is a sandbox started ahead of its job (Spec.Pool) that can do, while it waits for
// one, work its first command would otherwise do (bubblewrap: start that command's bwrap).
// A pool calls Warm once the sandbox waits in it; a sandbox a job takes at once is better off
// without: the job's first command would wait for it.
type Warmer interface {
	// Warm starts that work in the background; the channel closes once it is done or has
	// failed (a failure only means the first command does it itself).
	Warm() <-chan struct{}
}
