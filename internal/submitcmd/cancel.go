package submitcmd

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

func (e *env) cancelCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "cancel JOB_ID",
		Short: "stop a job: a queued one never starts, a running one is stopped by its worker",
		Args:  jobIDArgs(1, 1, "cancel: give one JOB_ID"),
		RunE:  func(c *cobra.Command, a []string) error { return e.cancel(c.Context(), a[0]) },
	}
	e.common(c, true)
	return c
}

// cancel stops a job: a queued one never starts; a running one is stopped by its worker within
// seconds, its sandbox removed and what it produced kept as a cancelled run.
func (e *env) cancel(ctx context.Context, id string) error {
	nc, q, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	st, err := q.Cancel(ctx, id, submitter())
	if errors.Is(err, queue.ErrFinal) {
		return &ExitError{Code: 1, Msg: fmt.Sprintf("job %s already ended: %s", id, st.State)}
	}
	if err != nil {
		return unknownJob(err, id, q.Tenant())
	}
	if e.json() {
		return e.printJSON(statusJSON(st))
	}
	if st.State == job.StateQueued {
		printf(e.stdout, "job %s: cancel requested; it will not start (a worker records it cancelled; follow with `submit watch %s`)\n", id, id)
	} else {
		printf(e.stdout, "job %s is %s; its worker will stop it (follow with `submit watch %s`)\n", id, st.State, id)
	}
	return nil
}
