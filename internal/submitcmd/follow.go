package submitcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

func (e *env) statusCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "status JOB_ID",
		Short: "a job's state, attempts, progress, spending and results",
		Args:  jobIDArgs(1, 1, "status: give one JOB_ID"),
		RunE:  func(c *cobra.Command, a []string) error { return e.status(c.Context(), a[0]) },
	}
	e.common(c, true)
	return c
}

func (e *env) watchCmd() *cobra.Command {
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "watch JOB_ID",
		Short: "follow a job until it ends; the exit code says how it ended",
		Args:  jobIDArgs(1, 1, "watch: give one JOB_ID"),
		RunE: func(c *cobra.Command, a []string) error {
			if err := atLeast("watch: --timeout", timeout, time.Nanosecond); err != nil {
				return err
			}
			nc, q, err := e.connect(c.Context())
			if err != nil {
				return err
			}
			defer nc.Close()
			return e.follow(c.Context(), q, a[0], timeout, true)
		},
	}
	c.Flags().DurationVar(&timeout, "timeout", 24*time.Hour, "give up waiting after this long (`DURATION`)")
	e.common(c, true)
	return c
}

// follow shows a job's progress until it ends, then prints where its results are. stream
// (watch) makes --output json one event per line, the final status last.
func (e *env) follow(ctx context.Context, q *queue.Client, id string, timeout time.Duration, stream bool) error {
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	updates, err := q.WatchStatus(tctx, id)
	if err != nil && tctx.Err() != nil && ctx.Err() == nil {
		return &ExitError{Code: exitGaveUp, Msg: fmt.Sprintf("gave up waiting for job %s after %s, before the watch started", id, timeout)}
	}
	if err != nil {
		return err
	}
	e.link.following("submit watch " + id)
	view := e.newView(ctx, q, stream)
	last := e.await(tctx, updates, view)
	view.done()
	if errors.Is(ctx.Err(), context.Canceled) { // Ctrl-C
		return &ExitError{Code: exitInterrupted, Msg: fmt.Sprintf("stopped watching; job %s keeps running (it is %s): watch it again with `submit watch %s`, stop it with `submit cancel %s`",
			id, orUnknown(last.State), id, id)}
	}
	jsonDone := stream && e.json() // every status is already a line
	if !last.State.Terminal() {
		return e.unfinished(tctx, q, id, timeout, last, jsonDone)
	}
	switch {
	case jsonDone:
	case e.json():
		if err := e.printJSON(statusJSON(last)); err != nil {
			return err
		}
	default:
		e.showFinal(last)
	}
	return finalExit(last)
}

// unfinished is how a watch ends whose job did not: unknown when the watch ended before the
// timeout (queue.WatchStatus ends for a job that stays unknown: never submitted here, or gone
// from the job stream with no status), else gave up at the timeout.
func (e *env) unfinished(tctx context.Context, q *queue.Client, id string, timeout time.Duration, last job.Status, jsonDone bool) error {
	switch {
	case tctx.Err() == nil && last.State == "":
		return fmt.Errorf("%w: %s: no status, and the job stream does not hold it after %s (was it submitted to this NATS server, as tenant %s? `submit list` shows the tenant's jobs)",
			queue.ErrUnknownJob, id, queue.UnknownGrace, q.Tenant())
	case tctx.Err() == nil:
		return fmt.Errorf("%w: %s: it was %s, then left the job stream with no status for %s: purged, or removed by a limit of the stream, before any worker recorded a status; submit it again if it should run",
			queue.ErrUnknownJob, id, last.State, queue.UnknownGrace)
	}
	msg := fmt.Sprintf("gave up waiting for job %s after %s; it is %s", id, timeout, orUnknown(last.State))
	if last.State == job.StateQueued {
		msg += "; no worker has started it (is a worker running and does it read this NATS server?)"
	}
	msg += fmt.Sprintf("; follow it later with `submit watch %s`", id)
	if e.json() && !jsonDone {
		_ = e.printJSON(statusJSON(last))
	}
	return &ExitError{Code: exitGaveUp, Msg: msg}
}

// await hands every status to view until the updates end, and ticks it every second.
func (e *env) await(ctx context.Context, updates <-chan job.Status, view progressView) job.Status {
	var last job.Status
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case st, ok := <-updates:
			if !ok {
				return last
			}
			view.update(ctx, st)
			last = st
		case <-tick.C:
			view.tick()
		}
	}
}

// unknownJob is err, when it says a job is unknown (queue.ErrUnknownJob), saying where submit
// looked for it: status, logs and approvals said "unknown job" alone, which a job id of
// another tenant or NATS server also gets.
func unknownJob(err error, id, tenant string) error {
	if !errors.Is(err, queue.ErrUnknownJob) {
		return err
	}
	return fmt.Errorf("%w: %s: no status, and the job stream does not hold it (was it submitted to this NATS server, as tenant %s? `submit list` shows the tenant's jobs)",
		queue.ErrUnknownJob, id, tenant)
}

func orUnknown(s job.State) string {
	if s == "" {
		return "unknown"
	}
	return string(s)
}

func (e *env) showProgress(st job.Status) {
	line := string(st.State)
	if st.State == job.StateRunning {
		line = fmt.Sprintf("running (attempt %d on %s)", st.Attempt, st.Worker)
	}
	if st.Progress != "" {
		line += ": " + st.Progress
	}
	// A job waiting for its next attempt shows why the last one failed: otherwise a watcher
	// sees "retrying" and nothing to act on (a dead store, a wrong key).
	if (st.State == job.StateRetrying || st.State == job.StateInterrupted) && st.Error != "" {
		line += ": " + st.Error
	}
	printf(e.stderr, "%s  %s\n", time.Now().Format("15:04:05"), line)
}

func (e *env) showFinal(st job.Status) {
	printf(e.stdout, "job %s %s", st.ID, st.State)
	if st.Cap != "" {
		printf(e.stdout, " (cap reached: %s)", st.Cap)
	}
	fmt.Fprintln(e.stdout)
	if st.Error != "" {
		printf(e.stdout, "error: %s\n", st.Error)
	}
	// A failed run can be committed without a report (one too large to keep): its manifest
	// still says what happened.
	if st.Report != "" {
		printf(e.stdout, "report: %s\n", st.Report)
	}
	if st.Manifest != "" {
		printf(e.stdout, "manifest: %s\n", st.Manifest)
	}
	if st.Unsigned {
		printf(e.stdout, "signature: %s\n", unsignedWords)
	}
}

// unsignedWords say what a status's Unsigned means to whoever reads it.
const unsignedWords = "none: the run is unsigned (the store refused the worker's copy of its signature into place; submit verify fails unless --allow-unsigned)"

// statusJSON is the machine-readable form of a status, stable for scripts.
func statusJSON(st job.Status) map[string]any {
	out := map[string]any{"id": st.ID, "state": orUnknown(st.State), "attempt": st.Attempt}
	for k, v := range map[string]string{"report": st.Report, "manifest": st.Manifest, "error": st.Error, "cap": st.Cap, "worker": st.Worker, "progress": st.Progress} {
		if v != "" {
			out[k] = v
		}
	}
	for k, t := range map[string]time.Time{"queued_at": st.QueuedAt, "started_at": st.StartedAt, "sandbox_claimed_at": st.SandboxClaimedAt, "finished_at": st.FinishedAt} {
		if !t.IsZero() {
			out[k] = t
		}
	}
	if !st.SandboxClaimedAt.IsZero() {
		out["sandbox_warm"] = st.SandboxWarm
	}
	if st.Unsigned {
		out["unsigned"] = true
	}
	if st.SpentTurns > 0 || st.SpentToolCalls > 0 || st.SpentTokens > 0 {
		out["spent"] = map[string]any{"turns": st.SpentTurns, "tool_calls": st.SpentToolCalls, "tokens": st.SpentTokens}
	}
	return out
}

func (e *env) status(ctx context.Context, id string) error {
	nc, q, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	st, err := q.Status(ctx, id)
	if err != nil {
		return unknownJob(err, id, q.Tenant())
	}
	usage := e.tenantUsage(ctx, nc)
	if e.json() {
		out := statusJSON(st)
		if usage != nil {
			out["tenant"] = usage
		}
		return e.printJSON(out)
	}
	printf(e.stdout, "job:      %s\nstate:    %s\nprofile:  %s\nattempts: %d\n", st.ID, st.State, st.Profile, st.Attempt)
	if !st.State.Terminal() {
		// The tenant's share of the queue: how long a queued job may wait. Left out when the
		// credentials may not read the consumer.
		if l, err := q.Lag(ctx); err == nil {
			printf(e.stdout, "queue:    tenant %s, %d waiting, %d running of at most %d\n", q.Tenant(), l.Pending, l.InFlight, l.MaxConcurrent)
		}
	}
	if st.CancelRequested && !st.State.Terminal() {
		printf(e.stdout, "cancel:   requested\n")
	}
	printStatusLines(e.stdout, st)
	if usage != nil {
		printf(e.stdout, "%s\n", usageLine(usage))
	}
	return nil
}

// printStatusLines writes the lines of a status that only some states have, each when set.
func printStatusLines(w io.Writer, st job.Status) {
	field := func(label, value string) {
		if value != "" {
			printf(w, "%-9s %s\n", label+":", value)
		}
	}
	field("worker", st.Worker)
	field("progress", st.Progress)
	for _, t := range []struct {
		name string
		at   time.Time
	}{{"queued", st.QueuedAt}, {"started", st.StartedAt}, {"sandbox", st.SandboxClaimedAt}, {"finished", st.FinishedAt}} {
		if !t.at.IsZero() {
			field(t.name, t.at.Local().Format(time.RFC3339)+claimNote(t.name, st))
		}
	}
	if st.SpentTurns > 0 || st.SpentToolCalls > 0 || st.SpentTokens > 0 {
		field("spent", fmt.Sprintf("%d turns, %d tool calls, %d tokens (all attempts)", st.SpentTurns, st.SpentToolCalls, st.SpentTokens))
	}
	field("cap", st.Cap)
	field("error", st.Error)
	field("report", st.Report)
	field("manifest", st.Manifest)
	if st.Unsigned {
		field("signature", unsignedWords)
	}
}

// claimNote says, on the sandbox line, whether the attempt's sandbox was warm.
func claimNote(line string, st job.Status) string {
	switch {
	case line != "sandbox":
		return ""
	case st.SandboxWarm:
		return " (warm: started ahead, claimed then)"
	default:
		return " (started for the job)"
	}
}
