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
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/store"
)

// maxTranscriptLine bounds one transcript line read back; the worker shrinks longer ones.
const maxTranscriptLine = 32 << 20

// maxShown bounds a model message or result shown in text; the transcript has all of it.
const maxShown = 400

func (e *env) logsCmd() *cobra.Command {
	var (
		follow bool
		trust  trustFlags
	)
	c := &cobra.Command{
		Use:   "logs JOB_ID",
		Short: "a run's steps, turns, tool calls and approvals, readable",
		Long: `Prints what a job did: its current status step (from NATS), then, once its run is
committed, every model turn and tool call of the stored transcript, with exit codes, timeouts
and approval waits. The transcript is shown as get would download it: the manifest's signature
checked with the keys verify uses (--keyring FILE, else --public-key FILE, else
$BOXCAR_HOME/keys/signing.pub, the embedded worker's) and the transcript's SHA-256 and size
with the manifest's, before any line of it is shown; a check that fails shows none of it (exit
8). --allow-unsigned shows a run that has no signature at all; with no key anywhere logs says
the signature was not checked. --follow shows the steps as they are read (every 250 ms: one
replaced sooner may not show, the last always does), which no signature covers, and the
transcript when the run commits.
With --output json each line is one event: {"source":"status",…} or {"source":"transcript","event":{…}}.`,
		Args: jobIDArgs(1, 1, "logs: give one JOB_ID"),
		RunE: func(c *cobra.Command, a []string) error { return e.logs(c.Context(), a[0], follow, trust) },
	}
	c.Flags().BoolVarP(&follow, "follow", "f", false, "keep following the job until it ends")
	trust.add(c, "show a run that has no signature, its transcript checked against the manifest alone")
	e.common(c, true)
	return c
}

func (e *env) logs(ctx context.Context, id string, follow bool, trust trustFlags) error {
	keys, err := e.signers(logsReader, trust)
	if err != nil {
		return err
	}
	nc, q, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	history, err := q.StatusHistory(ctx, id)
	if err != nil {
		return unknownJob(err, id, q.Tenant())
	}
	var last job.Status
	for _, st := range history {
		e.logStep(last, st)
		last = st
	}
	if follow && !last.State.Terminal() {
		if last, err = e.followSteps(ctx, q, id, last); err != nil {
			return err
		}
	}
	if !last.State.Terminal() {
		printf(e.stderr, "job %s is %s; the transcript is stored when the run commits (follow with `submit logs %s --follow`)\n", id, orUnknown(last.State), id)
		return nil
	}
	err = e.logTranscript(ctx, id, keys, trust.allowUnsigned)
	if errors.Is(err, errNotCommitted) && last.Manifest == "" {
		// Ended before it ran (cancelled while queued, rejected): the steps are all it did.
		printf(e.stderr, "job %s ended %s and kept no run: it has no transcript, the steps above are all it did\n", id, last.State)
		return nil
	}
	return err
}

// followSteps prints each status change from last on until the job ends or ctx does.
func (e *env) followSteps(ctx context.Context, q *queue.Client, id string, last job.Status) (job.Status, error) {
	updates, err := q.WatchStatus(ctx, id)
	if err != nil {
		return last, err
	}
	e.link.following("submit logs " + id + " --follow")
	// Nothing of a run is signed before it commits: what follows is NATS's word alone.
	printf(e.stderr, "following job %s: the steps are its status in NATS, which no signature covers; its transcript is shown when the run commits, once the manifest's signature and the transcript's digest are checked\n", id)
	for st := range updates {
		e.logStep(last, st)
		last = st
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return last, &ExitError{Code: exitInterrupted, Msg: fmt.Sprintf("stopped following; job %s keeps running: follow it again with `submit logs %s --follow`", id, id)}
	}
	return last, nil
}

// logStep prints st when it says something prev did not.
func (e *env) logStep(prev, st job.Status) {
	if st.State == prev.State && st.Progress == prev.Progress && st.Error == prev.Error && st.Attempt == prev.Attempt {
		return
	}
	if e.json() {
		out := statusJSON(st)
		out["source"], out["at"] = "status", st.UpdatedAt
		_ = e.printJSON(out)
		return
	}
	line := string(st.State)
	if st.Attempt > 0 && (st.State == job.StateRunning || st.Attempt != prev.Attempt) {
		line += fmt.Sprintf(" (attempt %d", st.Attempt)
		if st.Worker != "" {
			line += " on " + st.Worker
		}
		line += ")"
	}
	for _, s := range []string{st.Progress, st.Cap, st.Error} {
		if s != "" {
			line += ": " + s
		}
	}
	printf(e.stdout, "%s  %s\n", st.UpdatedAt.Local().Format(time.TimeOnly), line)
}

// logTranscript shows the committed run's transcript, one readable line per event, once the
// run is held to its signature (trustedRun, as get) and the transcript to the manifest's
// digest. The transcript is spooled to a temporary file while it is hashed and shown from
// there: read twice from the store, it could change between the check and the showing.
func (e *env) logTranscript(ctx context.Context, id string, keys signers, allowUnsigned bool) error {
	st, err := e.openStore(ctx)
	if err != nil {
		return err
	}
	defer closeStore(st)
	run, err := e.trustedRun(ctx, st, logsReader, id, keys, allowUnsigned)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(run.stmt.Subjects, func(s provenance.Subject) bool { return s.Name == transcriptName })
	if i < 0 {
		printf(e.stderr, "job %s: the run's manifest names no transcript\n", id)
		return nil
	}
	spool, err := e.checkedTranscript(ctx, st, id, run.stmt.Subjects[i])
	if err != nil {
		return err
	}
	defer closeSpool(spool)
	if err := e.renderTranscript(spool); err != nil {
		return err
	}
	printf(e.stderr, "checked %s against the manifest's sha256 digest%s\n", transcriptName, run.signer)
	return nil
}

const transcriptName = "transcript.jsonl"

// checkedTranscript copies the transcript s names into a temporary file while checking it
// against s, and returns the file at its start; a transcript that does not match is exit 8.
func (e *env) checkedTranscript(ctx context.Context, st store.Store, id string, s provenance.Subject) (*os.File, error) {
	key := provenance.SubjectKey(id, s)
	if err := roomFor(os.TempDir(), s.Size); err != nil {
		return nil, fmt.Errorf("logs: job %s: %s: %w; logs copies it into TMPDIR to check it before it shows a line: set TMPDIR to a folder with room (`submit verify %s` checks the size the manifest records); %s", id, s.Name, err, id, logsReader.nothing)
	}
	spool, err := os.CreateTemp("", "boxcar-transcript-")
	if err != nil {
		return nil, fmt.Errorf("logs: %w", err)
	}
	rc, err := st.Get(ctx, key)
	if err == nil {
		err = provenance.CopyChecked(spool, rc, key, s.SHA256, s.Size)
		rc.Close()
	}
	if err == nil {
		_, err = spool.Seek(0, io.SeekStart)
	}
	switch {
	case err == nil:
		return spool, nil
	case errors.Is(err, provenance.ErrDigestMismatch), errors.Is(err, store.ErrNotFound):
		closeSpool(spool)
		printf(e.stderr, "FAIL %s: %v\n", s.Name, err)
		return nil, &ExitError{Code: exitVerifyFailed, Msg: fmt.Sprintf("logs: job %s: %s does not match the manifest; %s", id, s.Name, logsReader.nothing)}
	}
	closeSpool(spool)
	return nil, fmt.Errorf("logs: job %s: %s: %w", id, s.Name, err)
}

// closeSpool closes and removes a temporary file.
func closeSpool(f *os.File) {
	_ = f.Close()
	_ = os.Remove(f.Name())
}

// renderTranscript prints each line of a transcript; a line it cannot read is said, not fatal.
func (e *env) renderTranscript(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxTranscriptLine)
	for sc.Scan() {
		// Numbers stay as written: the model sets a tool call's arguments, and a number
		// float64 cannot hold (1e400) is valid JSON that must not hide the line it is on.
		var ev map[string]any
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.UseNumber()
		if err := dec.Decode(&ev); err != nil {
			printf(e.stdout, "(a transcript line that is not JSON: %v)\n", err)
			continue
		}
		if e.json() {
			_ = e.printJSON(map[string]any{"source": "transcript", "event": ev})
			continue
		}
		e.printEvent(describeEvent(ev))
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("logs: read transcript: %w", err)
	}
	return nil
}

// printEvent prints an event's description: its first line, and each further line (the
// model's text, clip's) indented, every line escaped on its own. printf alone escaped the
// newlines of the layout too, and the text showed as one line with literal \n in it; a
// newline in any field still starts no line at the margin, where a forged event would.
func (e *env) printEvent(desc string) {
	for i, line := range strings.Split(desc, "\n") {
		if i > 0 && !strings.HasPrefix(line, "  ") {
			line = "  " + line
		}
		printf(e.stdout, "%s\n", line)
	}
}

// eventViews says how each kind of transcript event reads; a kind not listed (a newer worker's,
// such as egress decisions) is shown by its type and fields.
var eventViews = map[string]func(ev map[string]any) string{
	"request": func(ev map[string]any) string {
		msgs, _ := ev["messages"].([]any)
		return fmt.Sprintf("turn %v: request to the model (%d new messages)", num(ev["turn"]), len(msgs))
	},
	"response":  describeResponse,
	"tool_call": describeToolCall,
	"final": func(ev map[string]any) string {
		s := fmt.Sprintf("end: %s after %v turns, %v tool calls", str(ev["outcome"]), num(ev["turns"]), num(ev["tool_calls"]))
		if c := str(ev["cap"]); c != "" {
			s += " (cap " + c + ")"
		}
		if u, ok := ev["usage"].(map[string]any); ok {
			s += fmt.Sprintf(", %v tokens", num(u["total_tokens"]))
		}
		if msg := str(ev["error"]); msg != "" {
			s += "; error: " + msg
		}
		return s + clip(str(ev["message"]), "\n  ")
	},
	"truncated": func(ev map[string]any) string {
		return fmt.Sprintf("transcript truncated at %v bytes: %v later lines dropped", num(ev["limit_bytes"]), num(ev["dropped_lines"]))
	},
}

func describeEvent(ev map[string]any) string {
	kind := str(ev["type"])
	if view, ok := eventViews[kind]; ok {
		return view(ev)
	}
	rest := map[string]any{}
	for k, v := range ev {
		if k != "type" && k != "time" {
			rest[k] = v
		}
	}
	return fmt.Sprintf("[%s] %s", orDash(kind), clip(shownJSON(rest), ""))
}

func describeResponse(ev map[string]any) string {
	s := fmt.Sprintf("turn %v: model answered (%s", num(ev["turn"]), orDash(str(ev["finish_reason"])))
	if u, ok := ev["usage"].(map[string]any); ok {
		s += fmt.Sprintf(", %v tokens", num(u["total_tokens"]))
	}
	s += fmt.Sprintf(", %v ms)", num(ev["duration_ms"]))
	msg, _ := ev["message"].(map[string]any)
	var calls []string
	if tc, ok := msg["tool_calls"].([]any); ok {
		for _, c := range tc {
			fn, _ := c.(map[string]any)["function"].(map[string]any)
			calls = append(calls, str(fn["name"]))
		}
	}
	if len(calls) > 0 {
		s += " calls " + strings.Join(calls, ", ")
	}
	return s + clip(str(msg["content"]), "\n  ")
}

func describeToolCall(ev map[string]any) string {
	s := fmt.Sprintf("  tool %s", str(ev["tool"]))
	if argv, ok := ev["argv"].([]any); ok && len(argv) > 0 {
		s += " " + clip(shownJSON(argv), "")
	}
	switch {
	case ev["timed_out"] == true:
		s += ": timed out"
	case str(ev["error"]) != "":
		s += ": " + clip(str(ev["error"]), "")
	default:
		s += fmt.Sprintf(": exit %v", num(ev["exit_code"]))
	}
	s += fmt.Sprintf(" (%v ms", num(ev["duration_ms"]))
	if ms, ok := ev["approval_ms"]; ok {
		s += fmt.Sprintf(", %v ms waiting for approval", num(ms))
	}
	if a, ok := ev["approval"].(map[string]any); ok {
		s += ", " + str(a["decision"])
		if by := str(a["decided_by"]); by != "" {
			s += " by " + by
		}
	}
	if ev["truncated"] == true {
		s += ", output cut for the model"
	}
	return s + ")"
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// num shows a JSON number as an integer when it is one.
func num(v any) any {
	if n, ok := v.(json.Number); ok {
		if i, err := n.Int64(); err == nil {
			return i
		}
		if f, err := n.Float64(); err == nil {
			v = f
		}
	}
	if f, ok := v.(float64); ok && f == float64(int64(f)) {
		return int64(f)
	}
	if v == nil {
		return 0
	}
	return v
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// clip shortens s to maxShown runes and puts it after lead; empty stays empty.
func clip(s, lead string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return ""
	}
	if r := []rune(s); len(r) > maxShown {
		s = string(r[:maxShown]) + fmt.Sprintf("… (%d more characters in transcript.jsonl)", len(r)-maxShown)
	}
	return lead + strings.ReplaceAll(s, "\n", lead)
}
