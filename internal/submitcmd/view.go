package submitcmd

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// progressView shows a followed job's progress: on a terminal one block redrawn in place, in
// a pipe one line per change, with --output json (watch) one JSON event per line on stdout.
type progressView interface {
	update(ctx context.Context, st job.Status)
	tick() // a second passed: a terminal's elapsed time moves on
	done()
}

// isTerminal reports whether w, a writer or a reader, is a terminal (not a pipe or a file).
func isTerminal(w any) bool {
	f, ok := w.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(f.Fd()))
}

// newView picks the view for e's output; stream asks for JSON events (watch -o json).
func (e *env) newView(ctx context.Context, q *queue.Client, stream bool) progressView {
	switch {
	case stream && e.json():
		return &jsonView{e: e}
	case isTerminal(e.rawErr):
		e.link.inBlock()
		return &blockView{w: e.rawErr, q: q, link: e.link, limits: profileLimits(ctx, q)}
	}
	return &lineView{e: e}
}

// lineView prints a line on stderr for each change of state, progress or error.
type lineView struct {
	e    *env
	last job.Status
}

func (v *lineView) update(_ context.Context, st job.Status) {
	if st.State != v.last.State || st.Progress != v.last.Progress || st.Error != v.last.Error {
		v.e.showProgress(st)
	}
	v.last = st
}
func (v *lineView) tick() {}
func (v *lineView) done() {}

// jsonView prints every status it gets as one JSON line on stdout.
type jsonView struct{ e *env }

func (v *jsonView) update(_ context.Context, st job.Status) {
	out := statusJSON(st)
	out["profile"] = st.Profile
	_ = v.e.printJSON(out)
}
func (v *jsonView) tick() {}
func (v *jsonView) done() {}

// profileLimits reads the caps of every live profile, to show progress against; empty when
// the workers do not publish them.
func profileLimits(ctx context.Context, q *queue.Client) map[string]queue.ProfileInfo {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	out := map[string]queue.ProfileInfo{}
	entries, err := q.LiveProfiles(ctx)
	if err != nil {
		return out
	}
	for _, p := range liveProfiles(entries) {
		out[p.Name] = p.ProfileInfo
	}
	return out
}

// blockView redraws one block of lines on a terminal: it moves the cursor back up over the
// block it drew and clears to the end of the screen before drawing again. Everything a job
// wrote is cleaned first: this writer lets escapes through.
type blockView struct {
	w         io.Writer
	q         *queue.Client
	link      *natsLink // its notice is a line of the block while NATS is lost
	limits    map[string]queue.ProfileInfo
	st        job.Status
	approvals []queue.Approval
	lines     int // lines drawn last time
}

func (v *blockView) update(ctx context.Context, st job.Status) {
	if st.State == job.StateWaitingApproval {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		v.approvals, _, _ = v.q.PendingApprovals(actx, st.ID) // `submit approvals` says what it skipped
		cancel()
	} else {
		v.approvals = nil
	}
	v.st = st
	v.draw()
}

func (v *blockView) tick() { v.draw() }
func (v *blockView) done() { v.draw() }

func (v *blockView) draw() {
	var b strings.Builder
	if v.lines > 0 {
		fmt.Fprintf(&b, "\r\x1b[%dA\x1b[J", v.lines)
	}
	lines := blockLines(v.st, v.limits[v.st.Profile], v.approvals, time.Now())
	if n := v.link.notice(); n != "" {
		lines = append(lines, "  "+clean(n))
	}
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	v.lines = len(lines)
	_, _ = io.WriteString(v.w, b.String())
}

// blockLines is the block for st: state and elapsed time, progress, what the job spent
// against its caps, and the commands waiting for approval.
func blockLines(st job.Status, caps queue.ProfileInfo, approvals []queue.Approval, now time.Time) []string {
	state := string(st.State)
	if st.State == "" {
		state = "unknown"
	}
	if st.Attempt > 0 {
		state += fmt.Sprintf(" (attempt %d", st.Attempt)
		if st.Worker != "" {
			state += " on " + clean(st.Worker)
		}
		state += ")"
	}
	since, end := st.QueuedAt, now
	if !st.StartedAt.IsZero() {
		since = st.StartedAt
	}
	if !st.FinishedAt.IsZero() {
		end = st.FinishedAt
	}
	elapsed := "-"
	if !since.IsZero() {
		elapsed = end.Sub(since).Round(time.Second).String()
	}
	lines := []string{fmt.Sprintf("job %s  %s  %s", clean(st.ID), state, elapsed)}
	if st.Progress != "" {
		lines = append(lines, "  "+clean(st.Progress))
	}
	maxCalls := caps.MaxToolCalls
	if st.MaxCalls > 0 {
		maxCalls = st.MaxCalls
	}
	lines = append(lines, fmt.Sprintf("  turns %s   tool calls %s   tokens %s",
		ofCap(int64(st.SpentTurns), int64(caps.MaxTurns)), ofCap(int64(max(st.SpentToolCalls, st.ToolCalls)), int64(maxCalls)), ofCap(st.SpentTokens, caps.MaxTokens)))
	if st.Cap != "" {
		lines = append(lines, "  cap reached: "+clean(st.Cap))
	}
	if st.Error != "" {
		lines = append(lines, "  error: "+clean(st.Error))
	}
	for _, a := range approvals {
		lines = append(lines, fmt.Sprintf("  waiting for approval: call %s %s (submit approve %s %s --revision %d)", clean(a.CallID), clean(shownJSON(a.Argv)), clean(st.ID), clean(a.CallID), a.Revision))
	}
	return lines
}

func ofCap(n, limit int64) string {
	if limit > 0 {
		return fmt.Sprintf("%d/%d", n, limit)
	}
	return fmt.Sprint(n)
}
