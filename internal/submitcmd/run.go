package submitcmd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/cli"
	"github.com/boxcar-run/boxcar/internal/job"
)

// runFlags are the flags of `submit run`.
type runFlags struct {
	profile, task string
	id            string
	jobs          string
	inputs        []string
	labels        []string
	wait          bool
	timeout       time.Duration
}

func (e *env) runCmd() *cobra.Command {
	var f runFlags
	c := &cobra.Command{
		Use:   "run",
		Short: "submit a job; with --wait, follow it until it ends",
		Long: `Submits one job: every --input is uploaded to the store by its SHA-256, then the job is published.
Without --wait it prints the job id (with --output json: {"id":…,"state":"queued"}); with --wait
it follows the job and the exit code says how it ended.`,
		Args: cli.Args(0, 0, "run: takes no arguments; give the task with --task TEXT"),
		RunE: func(c *cobra.Command, _ []string) error { return e.run(c.Context(), f) },
	}
	fs := c.Flags()
	fs.SortFlags = false
	fs.StringVar(&f.profile, "profile", "", "execution profile the worker defines (`NAME`, required)")
	fs.StringVar(&f.task, "task", "", "what the agent should do (`TEXT`, required)")
	fs.StringArrayVar(&f.inputs, "input", nil, "input `FILE` (repeatable)")
	fs.StringArrayVar(&f.labels, "label", nil, "label `k=v` (repeatable)")
	fs.BoolVar(&f.wait, "wait", false, "follow the job until it ends; the exit code says how it ended")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Minute, "how long to wait for NATS and the store to answer (a leader election, a short outage) and, with --wait, for the job to end (`DURATION`)")
	fs.StringVar(&f.id, "id", "", "the job's `ID` instead of a new one: submitting the same id again while it is queued or running is refused as a duplicate, and once it ran runs nothing, so a script's retry never runs a job twice")
	fs.StringVar(&f.jobs, "jobs", "", "submit every job of `FILE` (JSON Lines: profile, task, inputs, labels, id; - for stdin) instead of one")
	markRequired(c, "profile", "task")
	_ = fs.SetAnnotation("jobs", altSynopsis, []string{"true"})
	c.Annotations = map[string]string{altSynopsis: "--jobs FILE [--wait] [--timeout DURATION]"}
	_ = c.MarkFlagFilename("input")
	_ = c.RegisterFlagCompletionFunc("profile", e.completeProfiles)
	e.common(c, true)
	return c
}

// newJob is the job the flags describe, its inputs still to upload; a mistake is bad usage.
func (f runFlags) newJob() (job.Job, error) {
	if f.profile == "" || strings.TrimSpace(f.task) == "" {
		return job.Job{}, cli.Usagef("run: --profile and --task are required")
	}
	id := f.id
	switch {
	case id == "":
		id = job.NewID()
	case !job.ValidID(id):
		return job.Job{}, cli.Usagef("run: --id %q is not a job id: use 8 to 64 lowercase letters, digits and '-', starting with a letter or digit", id)
	}
	j := job.Job{Version: job.Version, ID: id, Profile: f.profile, Task: f.task, SubmittedAt: time.Now().UTC(), SubmittedBy: submitter()}
	if len(f.labels) > 0 {
		j.Labels = map[string]string{}
		for _, l := range f.labels {
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				return job.Job{}, cli.Usagef("run: --label %q: use key=value", l)
			}
			j.Labels[k] = v
		}
	}
	return j, nil
}

func (e *env) run(ctx context.Context, f runFlags) error {
	if err := atLeast("run: --timeout", f.timeout, time.Nanosecond); err != nil {
		return err
	}
	e.patience = f.timeout
	if f.jobs != "" {
		if f.profile != "" || f.task != "" || len(f.inputs) > 0 || len(f.labels) > 0 || f.id != "" {
			return cli.Usagef("run: --jobs takes every job from the file; leave out --profile, --task, --input, --label and --id")
		}
		return e.runJobs(ctx, f)
	}
	j, err := f.newJob()
	if err != nil {
		return err
	}
	// Check every input and the job before touching NATS or the store, so a typo costs nothing.
	for _, name := range f.inputs {
		if err := checkInput(name); err != nil {
			return err
		}
	}
	if err := validateBefore(j, f.inputs); err != nil {
		return cli.Usagef("run: %v", err)
	}

	nc, q, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := e.checkProfile(ctx, q, profileNeed{profile: j.Profile, inputBytes: inputsBytes(f.inputs)}); err != nil {
		return err
	}
	st, err := e.openStore(ctx)
	if err != nil {
		return err
	}
	defer closeStore(st)
	inputs, err := e.upload(ctx, st, f.inputs)
	if err != nil {
		return err
	}
	for _, name := range f.inputs {
		j.Inputs = append(j.Inputs, inputs[name])
	}
	if err := j.Validate(); err != nil {
		return fmt.Errorf("run: %w", err)
	}
	dup, retried, err := e.publish.publish(ctx, q, j)
	if errors.Is(err, errUnknownOutcome) {
		// The id is the one thing a script needs to find out, or to retry safely.
		if e.json() {
			_ = e.printJSON(map[string]any{"id": j.ID, "state": "unknown"})
		} else {
			fmt.Fprintln(e.stdout, j.ID)
		}
		return &ExitError{Code: exitUnknown, Msg: fmt.Sprintf("job %s: %v; it may be queued: look with `submit status %s`, or submit it again with `--id %s` (dropped if the first one arrived)", j.ID, err, j.ID, j.ID)}
	}
	if err != nil {
		return err
	}
	// A duplicate on a retry is this command's own earlier attempt, whose ack was lost.
	if dup && !retried {
		fmt.Fprintf(e.stderr, "job %s was already submitted; following the earlier one\n", j.ID)
	}
	if !f.wait {
		if e.json() {
			return e.printJSON(map[string]any{"id": j.ID, "state": job.StateQueued})
		}
		fmt.Fprintf(e.stdout, "%s\n", j.ID)
		return nil
	}
	fmt.Fprintf(e.stderr, "submitted job %s (profile %s)\n", j.ID, j.Profile)
	return e.follow(ctx, q, j.ID, f.timeout, false)
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
