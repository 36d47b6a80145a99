package submitcmd

import (
	"context"
	"errors"
	"fmt"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// cancel stops a job: a queued one never starts; a running one is stopped by its worker within
// seconds, its sandbox removed and what it produced kept as a cancelled run.
func (e *env) cancel(ctx context.Context, args []string) error {
	fs := e.flags("cancel")
	rest, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return errors.New("cancel: give one JOB_ID")
	}
	id := rest[0]
	nc, q, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	if _, err := q.Status(ctx, id); err != nil {
		return err
	}
	st, err := q.UpdateStatus(ctx, id, job.RequestCancel)
	if errors.Is(err, queue.ErrFinal) {
		return &ExitError{Code: 1, Msg: fmt.Sprintf("job %s already ended: %s", id, st.State)}
	}
	if err != nil {
		return err
	}
	if e.output == "json" {
		return e.printJSON(statusJSON(st))
	}
	if st.State == job.StateCancelled {
		fmt.Fprintf(e.stdout, "job %s cancelled before it started\n", id)
	} else {
		fmt.Fprintf(e.stdout, "job %s is %s; its worker will stop it (follow with `submit watch %s`)\n", id, st.State, id)
	}
	return nil
}
