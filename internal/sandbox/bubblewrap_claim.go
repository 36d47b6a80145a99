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
// Nothing else of the sandbox changes: its folder, cgroup and uid were never anyone's.
func (s *bubblewrapSandbox) Claim(ctx context.Context, tenant, jobID string) error {
	id, err := s.begin(nil)
	if err != nil {
		return fmt.Errorf("sandbox: claim %s: %w", s.id, err)
	}
	defer s.end(id)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sandbox: claim %s: %w", s.id, err)
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
