package submitcmd

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/store"
)

// maxInputBytes bounds one input file; larger data belongs in the store, not a batch job.
const maxInputBytes = 256 << 20

func (e *env) run(ctx context.Context, args []string) error {
	fs := e.flags("run")
	var (
		profile, task string
		inputs        stringList
		labels        stringList
		wait          bool
		timeout       time.Duration
	)
	fs.StringVar(&profile, "profile", "", "execution profile the worker defines (required)")
	fs.StringVar(&task, "task", "", "what the agent should do (required)")
	fs.Var(&inputs, "input", "input file (repeatable)")
	fs.Var(&labels, "label", "label key=value (repeatable)")
	fs.BoolVar(&wait, "wait", false, "follow the job until it ends; the exit code says how it ended")
	fs.DurationVar(&timeout, "timeout", 30*time.Minute, "with --wait: give up waiting after this long")
	if rest, err := e.parse(fs, args); err != nil {
		return err
	} else if len(rest) > 0 {
		return fmt.Errorf("run: unexpected argument %q", rest[0])
	}
	if profile == "" || strings.TrimSpace(task) == "" {
		return errors.New("run: --profile and --task are required")
	}
	j := job.Job{Version: job.Version, ID: job.NewID(), Profile: profile, Task: task, SubmittedAt: time.Now().UTC(), SubmittedBy: submitter()}
	if len(labels) > 0 {
		j.Labels = map[string]string{}
		for _, l := range labels {
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				return fmt.Errorf("run: --label %q: use key=value", l)
			}
			j.Labels[k] = v
		}
	}
	// Read every input before touching NATS or the store, so a typo costs nothing.
	contents := make([][]byte, len(inputs))
	for i, name := range inputs {
		data, err := readInput(name)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		contents[i] = data
		j.Inputs = append(j.Inputs, job.Input{Name: filepath.Base(name), SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data))})
	}

	nc, q, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	st, err := e.openStore(ctx)
	if err != nil {
		return err
	}
	for i := range j.Inputs {
		in := &j.Inputs[i]
		key := store.InputKey(in.SHA256)
		in.URI = st.URL(key)
		err := st.PutIfAbsent(ctx, key, bytes.NewReader(contents[i]), in.Size)
		if err != nil && !errors.Is(err, store.ErrExists) {
			return fmt.Errorf("run: upload input %s: %w", in.Name, err)
		}
	}
	if err := j.Validate(); err != nil {
		return fmt.Errorf("run: %w", err)
	}
	dup, err := q.Publish(ctx, j)
	if err != nil {
		return err
	}
	if dup {
		fmt.Fprintf(e.stderr, "job %s was already submitted; following the earlier one\n", j.ID)
	}
	if !wait {
		if e.output == "json" {
			return e.printJSON(map[string]any{"id": j.ID, "state": job.StateQueued})
		}
		fmt.Fprintf(e.stdout, "%s\n", j.ID)
		return nil
	}
	fmt.Fprintf(e.stderr, "submitted job %s (profile %s)\n", j.ID, j.Profile)
	return e.follow(ctx, q, j.ID, timeout)
}

func readInput(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("run: input %s: %w", name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("run: input %s: %w", name, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("run: input %s is not a regular file", name)
	}
	if fi.Size() > maxInputBytes {
		return nil, fmt.Errorf("run: input %s is %d bytes; the limit is %d", name, fi.Size(), maxInputBytes)
	}
	return io.ReadAll(f)
}

func submitter() string {
	if u, err := user.Current(); err == nil {
		if h, err := os.Hostname(); err == nil {
			return u.Username + "@" + h
		}
		return u.Username
	}
	return ""
}

// follow shows a job's progress until it ends, then prints where its results are.
func (e *env) follow(ctx context.Context, q *queue.Queue, id string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	updates, err := q.WatchStatus(ctx, id)
	if err != nil {
		return err
	}
	var last job.Status
	for st := range updates {
		if st.State != last.State || st.Progress != last.Progress || st.Error != last.Error {
			e.showProgress(st)
		}
		last = st
	}
	if !last.State.Terminal() {
		msg := fmt.Sprintf("gave up waiting for job %s after %s; it is %s", id, timeout, orUnknown(last.State))
		if last.State == job.StateQueued {
			msg += "; no worker has started it (is a worker running and does it read this NATS server?)"
		}
		msg += fmt.Sprintf("; follow it later with `submit watch %s`", id)
		if e.output == "json" {
			_ = e.printJSON(statusJSON(last))
		}
		return &ExitError{Code: exitGaveUp, Msg: msg}
	}
	if e.output == "json" {
		if err := e.printJSON(statusJSON(last)); err != nil {
			return err
		}
	} else {
		e.showFinal(last)
	}
	return finalExit(last)
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
	fmt.Fprintf(e.stderr, "%s  %s\n", time.Now().Format("15:04:05"), line)
}

func (e *env) showFinal(st job.Status) {
	fmt.Fprintf(e.stdout, "job %s %s", st.ID, st.State)
	if st.Cap != "" {
		fmt.Fprintf(e.stdout, " (cap reached: %s)", st.Cap)
	}
	fmt.Fprintln(e.stdout)
	if st.Error != "" {
		fmt.Fprintf(e.stdout, "error: %s\n", st.Error)
	}
	// A failed run can be committed without a report (one too large to keep): its manifest
	// still says what happened.
	if st.Report != "" {
		fmt.Fprintf(e.stdout, "report: %s\n", st.Report)
	}
	if st.Manifest != "" {
		fmt.Fprintf(e.stdout, "manifest: %s\n", st.Manifest)
	}
}

// statusJSON is the machine-readable form of a status, stable for scripts.
func statusJSON(st job.Status) map[string]any {
	out := map[string]any{"id": st.ID, "state": orUnknown(st.State), "attempt": st.Attempt}
	for k, v := range map[string]string{"report": st.Report, "manifest": st.Manifest, "error": st.Error, "cap": st.Cap, "worker": st.Worker, "progress": st.Progress} {
		if v != "" {
			out[k] = v
		}
	}
	for k, t := range map[string]time.Time{"queued_at": st.QueuedAt, "started_at": st.StartedAt, "finished_at": st.FinishedAt} {
		if !t.IsZero() {
			out[k] = t
		}
	}
	if st.SpentTurns > 0 || st.SpentToolCalls > 0 || st.SpentTokens > 0 {
		out["spent"] = map[string]any{"turns": st.SpentTurns, "tool_calls": st.SpentToolCalls, "tokens": st.SpentTokens}
	}
	return out
}

func (e *env) status(ctx context.Context, args []string) error {
	fs := e.flags("status")
	rest, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return errors.New("status: give one JOB_ID")
	}
	nc, q, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	st, err := q.Status(ctx, rest[0])
	if err != nil {
		return err
	}
	if e.output == "json" {
		return e.printJSON(statusJSON(st))
	}
	fmt.Fprintf(e.stdout, "job:      %s\nstate:    %s\nprofile:  %s\nattempts: %d\n", st.ID, st.State, st.Profile, st.Attempt)
	if st.Worker != "" {
		fmt.Fprintf(e.stdout, "worker:   %s\n", st.Worker)
	}
	if st.Progress != "" {
		fmt.Fprintf(e.stdout, "progress: %s\n", st.Progress)
	}
	for _, t := range []struct {
		name string
		at   time.Time
	}{{"queued", st.QueuedAt}, {"started", st.StartedAt}, {"finished", st.FinishedAt}} {
		if !t.at.IsZero() {
			fmt.Fprintf(e.stdout, "%-9s %s\n", t.name+":", t.at.Local().Format(time.RFC3339))
		}
	}
	if st.SpentTurns > 0 || st.SpentToolCalls > 0 || st.SpentTokens > 0 {
		fmt.Fprintf(e.stdout, "spent:    %d turns, %d tool calls, %d tokens (all attempts)\n", st.SpentTurns, st.SpentToolCalls, st.SpentTokens)
	}
	if st.Cap != "" {
		fmt.Fprintf(e.stdout, "cap:      %s\n", st.Cap)
	}
	if st.Error != "" {
		fmt.Fprintf(e.stdout, "error:    %s\n", st.Error)
	}
	if st.Report != "" {
		fmt.Fprintf(e.stdout, "report:   %s\n", st.Report)
	}
	if st.Manifest != "" {
		fmt.Fprintf(e.stdout, "manifest: %s\n", st.Manifest)
	}
	return nil
}

func (e *env) watch(ctx context.Context, args []string) error {
	fs := e.flags("watch")
	timeout := fs.Duration("timeout", 24*time.Hour, "give up waiting after this long")
	rest, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return errors.New("watch: give one JOB_ID")
	}
	nc, q, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	if _, err := q.Status(ctx, rest[0]); err != nil {
		return err
	}
	return e.follow(ctx, q, rest[0], *timeout)
}
