package submitcmd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// maxInFlight bounds the jobs published and not yet acknowledged by the server.
const maxInFlight = 256

// maxJobLine bounds one line of a jobs file: a job message is at most job.MaxMessageBytes.
const maxJobLine = 2 * job.MaxMessageBytes

// jobLine is one line of a jobs file (JSON Lines).
type jobLine struct {
	Profile string            `json:"profile"`
	Task    string            `json:"task"`
	Inputs  []string          `json:"inputs,omitempty"` // file paths, relative to the current folder
	Labels  map[string]string `json:"labels,omitempty"`
	ID      string            `json:"id,omitempty"` // optional, as --id
}

// batchJob is a line made into a job, with where it came from.
type batchJob struct {
	line   int
	paths  []string
	job    job.Job
	result map[string]any // the line printed for it
}

// readJobs parses a whole jobs file before anything is sent: a bad line fails the command,
// naming the line, and nothing is submitted.
func readJobs(r io.Reader, name string) ([]*batchJob, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxJobLine)
	var (
		jobs []*batchJob
		ids  = map[string]int{}
		by   = submitter()
		now  = time.Now().UTC()
	)
	for n := 1; sc.Scan(); n++ {
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		bad := func(format string, args ...any) error {
			return fmt.Errorf("run: --jobs %s line %d: %s; nothing was submitted", name, n, fmt.Sprintf(format, args...))
		}
		dec := json.NewDecoder(bytes.NewReader(text))
		dec.DisallowUnknownFields()
		var l jobLine
		if err := dec.Decode(&l); err != nil {
			return nil, bad("%v (each line is one JSON object: profile, task, inputs, labels, id)", err)
		}
		if dec.More() {
			return nil, bad("more than one JSON value")
		}
		if l.Profile == "" || strings.TrimSpace(l.Task) == "" {
			return nil, bad("profile and task are required")
		}
		id := l.ID
		switch {
		case id == "":
			id = job.NewID()
		case !job.ValidID(id):
			return nil, bad("id %q is not a job id", id)
		}
		if first, ok := ids[id]; ok {
			return nil, bad("id %s is also on line %d", id, first)
		}
		ids[id] = n
		for _, p := range l.Inputs {
			if err := checkInput(p); err != nil {
				return nil, bad("%v", err)
			}
		}
		j := job.Job{Version: job.Version, ID: id, Profile: l.Profile, Task: l.Task, Labels: l.Labels, SubmittedAt: now, SubmittedBy: by}
		if err := validateBefore(j, l.Inputs); err != nil {
			return nil, bad("%v", err)
		}
		jobs = append(jobs, &batchJob{line: n, paths: l.Inputs, job: j})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("run: --jobs %s: %w; nothing was submitted", name, err)
	}
	if len(jobs) == 0 {
		return nil, fmt.Errorf("run: --jobs %s holds no jobs", name)
	}
	return jobs, nil
}

// runJobs is `submit run --jobs FILE`: every input uploaded once per digest, every job
// published with at most maxInFlight unacknowledged, one JSON line per job on stdout.
func (e *env) runJobs(ctx context.Context, f runFlags) error {
	in, name := e.input(), "stdin"
	if f.jobs != "-" {
		file, err := os.Open(f.jobs)
		if err != nil {
			return fmt.Errorf("run: --jobs: %w", err)
		}
		defer file.Close()
		in, name = file, f.jobs
	}
	jobs, err := readJobs(in, name)
	if err != nil {
		return err
	}

	nc, q, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	needs := make([]profileNeed, 0, len(jobs))
	for _, bj := range jobs {
		needs = append(needs, profileNeed{profile: bj.job.Profile, inputBytes: inputsBytes(bj.paths), where: fmt.Sprintf("--jobs %s line %d", name, bj.line)})
	}
	if err := e.checkProfile(ctx, q, needs...); err != nil {
		return err
	}
	var paths []string
	for _, bj := range jobs {
		paths = append(paths, bj.paths...)
	}
	if len(paths) > 0 {
		st, err := e.openStore(ctx)
		if err != nil {
			return err
		}
		defer closeStore(st)
		inputs, err := e.upload(ctx, st, paths)
		if err != nil {
			return err
		}
		for _, bj := range jobs {
			for _, p := range bj.paths {
				bj.job.Inputs = append(bj.job.Inputs, inputs[p])
			}
		}
	}

	code := e.publishAll(ctx, q, e.publish, jobs)
	if ctx.Err() != nil {
		return &ExitError{Code: exitInterrupted, Msg: "interrupted while publishing: each line says whether its job was queued, not confirmed (\"unknown\": look with `submit status ID`) or not sent (\"error\"); submit the lines not queued again with their \"id\" (dropped if the first one arrived)"}
	}
	if f.wait {
		code = max(code, e.followAll(ctx, q, jobs, f.timeout))
	}
	switch code {
	case 0:
		return nil
	case exitUnknown:
		return &ExitError{Code: code, Msg: "the server did not confirm some submissions (state \"unknown\"); submit those lines again with their \"id\": the server drops any that arrived"}
	case 1:
		return &ExitError{Code: 1, Msg: "some jobs were not submitted (state \"error\"); see their lines"}
	default:
		return &ExitError{Code: code, Msg: "not every job succeeded; see the lines on stdout"}
	}
}

// pending is one job's async publish: the handle to wait on, or why it could not be sent.
type pending struct {
	bj  *batchJob
	p   *queue.PendingPublish
	err error
}

// publishAll publishes every job asynchronously, in order, and prints each job's line as its
// ack comes back. A job whose async publish failed is published again the one-by-one way, with
// its retries. Interrupted (ctx ends), it sends no more, and every line left gets its output
// line too, saying it was not sent. It returns the exit code: 0, 1 (some not submitted) or
// exitUnknown.
func (e *env) publishAll(ctx context.Context, q *queue.Client, policy publishPolicy, jobs []*batchJob) int {
	inflight := make(chan pending, maxInFlight)
	go func() {
		defer close(inflight)
		for _, bj := range jobs {
			if ctx.Err() != nil {
				return
			}
			p, err := q.PublishAsync(bj.job)
			inflight <- pending{bj, p, err}
		}
	}()
	code := 0
	report := func(bj *batchJob, dup bool, err error) {
		var c int
		bj.result, c = lineResult(bj, dup, err)
		code = max(code, c)
		if err := e.printJSON(bj.result); err != nil {
			code = max(code, 1)
		}
	}
	for pd := range inflight {
		dup, err := settle(ctx, q, policy, pd)
		report(pd.bj, dup, err)
	}
	for _, bj := range jobs {
		if bj.result == nil { // never sent: the run was interrupted before its turn
			report(bj, false, errNotSent)
		}
	}
	return code
}

// errNotSent is the error of a line an interrupted run never sent.
var errNotSent = errors.New("interrupted before it was sent: not submitted; submit the line again")

// settle waits for one async publish and, when it failed, publishes the job again the
// one-by-one way. Its duplicate is someone else's submission of the id, never this command's
// own async copy; an error wraps errUnknownOutcome when that copy may have been stored.
func settle(ctx context.Context, q *queue.Client, policy publishPolicy, pd pending) (duplicate bool, err error) {
	if pd.err != nil {
		err = pd.err // not sent
	} else {
		actx, cancel := context.WithTimeout(ctx, policy.attempt)
		duplicate, err = pd.p.Wait(actx)
		cancel()
	}
	// Sent without a confirmation (a lost ack, an interrupt): the stream may hold it now.
	ambiguous := pd.err == nil && err != nil && !notSent(err)
	if err != nil && !permanent(err) && ctx.Err() == nil {
		var retried bool
		duplicate, retried, err = policy.publish(ctx, q, pd.bj.job)
		// A duplicate of an async copy that may have been stored is that copy, as on a retry.
		duplicate = duplicate && !retried && !ambiguous
	}
	if err != nil && ambiguous && !permanent(err) && !errors.Is(err, errUnknownOutcome) {
		err = fmt.Errorf("%w: %w", errUnknownOutcome, err)
	}
	return duplicate, err
}

// lineResult is the output line of a job and its exit code.
func lineResult(bj *batchJob, dup bool, err error) (map[string]any, int) {
	res := map[string]any{"line": bj.line, "id": bj.job.ID, "state": job.StateQueued}
	switch {
	case errors.Is(err, errUnknownOutcome):
		res["state"], res["error"] = "unknown", clean(err.Error())
		return res, exitUnknown
	case err != nil:
		res["state"], res["error"] = "error", clean(err.Error())
		return res, 1
	case dup:
		res["duplicate"] = true
	}
	return res, 0
}

// followAll follows every submitted job with one progress line, then prints each job's final
// status as a JSON line. The exit code is the highest of the jobs' (7 for those still running
// at the timeout).
func (e *env) followAll(ctx context.Context, q *queue.Client, jobs []*batchJob, timeout time.Duration) int {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var ids []string
	for _, bj := range jobs {
		if bj.result["state"] == job.StateQueued {
			ids = append(ids, bj.job.ID)
		}
	}
	last := make(map[string]job.Status, len(ids))
	if len(ids) > 0 {
		updates, err := q.WatchStatuses(ctx, ids)
		if err != nil {
			printf(e.stderr, "submit: %v\n", err)
			return 1
		}
		e.countStates(ids, updates, last)
	}
	code := 0
	for _, bj := range jobs {
		st, ok := last[bj.job.ID]
		if bj.result["state"] != job.StateQueued {
			continue // already reported as not submitted
		}
		if !ok {
			st = job.Status{ID: bj.job.ID}
		}
		out := statusJSON(st)
		out["line"] = bj.line
		_ = e.printJSON(out)
		c, known := exitCodes[st.State]
		if !known || !st.State.Terminal() {
			c = exitGaveUp
		}
		code = max(code, c)
	}
	return code
}

// progressLine counts the jobs by state, in the order a job goes through them.
func progressLine(ids []string, last map[string]job.Status) string {
	order := []job.State{job.StateQueued, job.StateRunning, job.StateWaitingApproval, job.StateRetrying, job.StateInterrupted,
		job.StateSucceeded, job.StateCapped, job.StateFailed, job.StateRejected, job.StateCancelled, job.StateDead}
	counts := map[job.State]int{}
	for _, id := range ids {
		st := last[id].State
		if st == "" {
			st = job.StateQueued
		}
		counts[st]++
	}
	var parts []string
	for _, s := range order {
		if counts[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[s], s))
		}
	}
	return fmt.Sprintf("%d jobs: %s", len(ids), strings.Join(parts, ", "))
}

// countStates keeps last up to date from updates and shows the progress line: at most once a
// second, and within a second of each change, also when no further change comes to show it.
func (e *env) countStates(ids []string, updates <-chan job.Status, last map[string]job.Status) {
	var shown string
	var shownAt time.Time
	show := func(force bool) {
		if line := progressLine(ids, last); line != shown && (force || time.Since(shownAt) >= time.Second) {
			fmt.Fprintf(e.stderr, "%s  %s\n", time.Now().Format("15:04:05"), line)
			shown, shownAt = line, time.Now()
		}
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case st, ok := <-updates:
			if !ok {
				show(true)
				return
			}
			last[st.ID] = st
			show(false)
		case <-tick.C:
			show(false)
		}
	}
}
