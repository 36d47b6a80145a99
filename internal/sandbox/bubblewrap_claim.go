package sandbox

import (
	"context"
	"fmt"
	"time"
)

var _ Claimer = (*bubblewrapSandbox)(nil)

// Claim binds a pool sandbox to its job: the lifetime starts again from now, its usage counts
// from now (its spare's start was before the job), and the log lines name the job and its
// tenant (a bubblewrap sandbox names its tenant nowhere else: none outlives its worker).
// Nothing else of the sandbox changes: its folder, cgroup and uid were never anyone's. A
// sandbox whose workdir went away while it waited (gone: an operator's cleanup of the Root) is
// refused as closed, for the pool to replace: handed over, every call of its job failed with
// ErrSandboxLost and the job spent a delivery.
func (s *bubblewrapSandbox) Claim(ctx context.Context, tenant, jobID string) error {
	id, err := s.begin(nil)
	if err != nil {
		return fmt.Errorf("sandbox: claim %s: %w", s.id, err)
	}
	defer s.end(id)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sandbox: claim %s: %w", s.id, err)
	}
	if err := s.gone(); err != nil {
		return fmt.Errorf("sandbox: claim %s: %w: %w", s.id, err, ErrClosed)
	}
	if !s.expiry.Stop() {
		return fmt.Errorf("sandbox: claim %s: its lifetime passed while it waited: %w", s.id, ErrClosed)
	}
	s.expiry = time.AfterFunc(s.lifetime, s.expire)
	if s.cg != nil {
		s.cg.countFromClaim()
	}
	s.log = s.log.With("job_id", jobID, "tenant", tenant)
	s.log.Info("sandbox claimed")
	return nil
}
