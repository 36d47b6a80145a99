package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/job"
)

// adoptBareJobs moves the jobs left on the bare subject boxcar.jobs, where submitters before
// tenants published them and named them only by their Nats-Msg-Id header, to tenant default's
// subject boxcar.jobs.default.ID, before the job stream stops taking that subject: they run as
// they would have, named by their subject like every other job. A message whose header is no
// job id moves under stream-seq-N, the id the worker records such a message under, and is
// rejected there with the reason. Nothing to do on a new stream, or one set up since. Their
// inputs, and the runs committed before tenants, are at the store's root, which the queue does
// not know: each worker moves them into tenant default's folder before it fetches a job
// (runner's AdoptRootLayout), so no job moved here runs before they are in place.
func (a *Admin) adoptBareJobs(ctx context.Context) error {
	bare := a.cfg.Subject
	s, err := a.js.Stream(ctx, a.cfg.Stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("queue: look up stream %s: %w", a.cfg.Stream, err)
	}
	cur := s.CachedInfo().Config
	if !slices.Contains(cur.Subjects, bare) {
		return nil
	}
	// The tenants' subjects first (a stream older than tenants has none), so that the moved
	// jobs have somewhere to go.
	if all := bare + ".*.*"; !slices.Contains(cur.Subjects, all) {
		cur.Subjects = append(cur.Subjects, all)
		if s, err = a.js.UpdateStream(ctx, cur); err != nil {
			return fmt.Errorf("queue: add the subject %s to stream %s: %w", all, a.cfg.Stream, err)
		}
	}
	moved := 0
	for seq := uint64(1); ; moved++ {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(bare))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return fmt.Errorf("queue: read the jobs left on %s: %w", bare, err)
		}
		id := m.Header.Get(jetstream.MsgIDHeader)
		if !job.ValidID(id) {
			id = job.SeqID(m.Sequence)
		}
		to := jobSubject(a.cfg, Ref{Tenant: job.DefaultTenant, ID: id})
		if _, err := a.js.PublishMsg(ctx, &nats.Msg{Subject: to, Data: m.Data}); err != nil {
			return fmt.Errorf("queue: move job %s from %s to %s: %w", id, bare, to, err)
		}
		if err := s.DeleteMsg(ctx, m.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("queue: remove job %s from %s once moved: %w", id, bare, err)
		}
		seq = m.Sequence + 1
	}
	if moved > 0 {
		a.log.WarnContext(ctx, "moved the jobs left on the subject of submitters before tenants to tenant default's subjects; publish on boxcar.jobs.TENANT.ID from now on, the bare subject takes no more jobs",
			"stream", a.cfg.Stream, "subject", bare, "jobs", moved)
	}
	return nil
}
