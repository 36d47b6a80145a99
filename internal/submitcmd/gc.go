package submitcmd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/cli"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/store"
)

// defaultGCGrace is how long ago an attempt folder must have been written last before gc
// removes it: far longer than any sane job_timeout plus ack_wait.
const defaultGCGrace = 24 * time.Hour

// What gc did or would do with a folder (gcFolder.Action).
const (
	gcWouldDelete  = "would_delete"
	gcDeleted      = "deleted"
	gcKept         = "kept"
	gcDeleteFailed = "delete_failed"
)

// gcFolder is one attempt folder, runs/<id>/attempts/<n>-<random>/, that no committed manifest
// names, and what gc did with it.
type gcFolder struct {
	JobID   string `json:"job_id"`
	Folder  string `json:"folder"` // its key prefix
	Objects int    `json:"objects"`
	// Partials counts the unfinished uploads in it (store.Partial), left by an attempt killed
	// mid-upload: no listing of objects shows them. Bytes counts theirs too.
	Partials int       `json:"partials"`
	Bytes    int64     `json:"bytes"`
	Written  time.Time `json:"written"` // when its newest object or unfinished upload was written
	Action   string    `json:"action"`
	Reason   string    `json:"reason"`
	keys     []string
	partials []store.Partial
}

// gcOutput is what gc prints with --output json.
type gcOutput struct {
	Store     string     `json:"store"`
	OlderThan string     `json:"older_than"`
	Delete    bool       `json:"delete"`
	Folders   []gcFolder `json:"folders"`
	// Unfinished are the unfinished uploads outside every attempt folder.
	Unfinished []gcUpload `json:"unfinished_uploads"`
	// Objects and Bytes add up the folders and uploads deleted (with --delete) or that would be.
	Objects int   `json:"objects"`
	Bytes   int64 `json:"bytes"`
}

// gcUpload is an unfinished upload (store.Partial) outside every attempt folder, and what gc did
// with it: an input of a `submit run` killed mid-upload, a manifest of a worker killed while it
// committed. Nothing names one, and no job's end decides for it: it goes once nothing has
// written to it for the grace, as a live upload writes on.
type gcUpload struct {
	Key     string    `json:"key"`
	Bytes   int64     `json:"bytes"`
	Written time.Time `json:"written"`
	Action  string    `json:"action"`
	Reason  string    `json:"reason"`
	partial store.Partial
}

func (e *env) gcCmd() *cobra.Command {
	var (
		olderThan time.Duration
		del       bool
	)
	c := &cobra.Command{
		Use:   "gc",
		Short: "remove attempt folders no committed manifest names (lists them unless --delete)",
		Long: `Lists the attempt folders (runs/<id>/attempts/<n>-<random>/) of jobs that have ended which their
committed manifest does not name: attempts that crashed, went stale or were paused past
ack_wait. With --delete it removes them. An object the manifest names is never touched, nor
anything of a job that has not ended, nor a folder written to within --older-than (and within
the job's job_timeout plus the consumer's ack_wait). A job has ended when its manifest is
committed, or when its status is dead or failed, with no manifest, since longer than
--older-than.`,
		Args: cli.Args(0, 0, "gc: takes no arguments"),
		RunE: func(c *cobra.Command, _ []string) error { return e.gc(c.Context(), olderThan, del) },
	}
	c.Flags().DurationVar(&olderThan, "older-than", defaultGCGrace, "leave folders written to within this long; keep it longer than the workers' job_timeout plus ack_wait (`DURATION`)")
	c.Flags().BoolVar(&del, "delete", false, "delete the folders listed; without it nothing is deleted")
	e.common(c, true)
	return c
}

func (e *env) gc(ctx context.Context, olderThan time.Duration, del bool) error {
	if olderThan <= 0 {
		return fmt.Errorf("gc: --older-than %s: give a duration longer than the workers' job_timeout plus ack_wait (default %s)", olderThan, defaultGCGrace)
	}
	nc, q, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	ackWait, err := q.ConsumerAckWait(ctx)
	if err != nil {
		return fmt.Errorf("gc: %w", err)
	}
	if olderThan <= ackWait {
		return fmt.Errorf("gc: --older-than %s is not longer than the workers' ack_wait (%s): a live attempt could lose its folder; give more than job_timeout plus ack_wait", olderThan, ackWait)
	}
	st, err := e.openStore(ctx)
	if err != nil {
		return err
	}
	defer closeStore(st)

	now := time.Now()
	folders, strays, err := listAttemptFolders(ctx, st)
	if err != nil {
		return fmt.Errorf("gc: %w", err)
	}
	out := gcOutput{Store: st.URL(""), OlderThan: olderThan.String(), Delete: del, Folders: []gcFolder{}}
	failed := gcUploads(ctx, st, strays, now, olderThan, del, &out)
	for _, id := range slices.Sorted(maps.Keys(folders)) {
		end, err := judgeEnd(ctx, st, q, e.tenant(), id, now, olderThan, ackWait)
		if err != nil {
			return fmt.Errorf("gc: job %s: %w", id, err)
		}
		var doomed []*gcFolder
		for _, f := range folders[id] {
			switch {
			case end.named[f.Folder]:
				continue // the committed attempt's: never listed, never touched
			case !end.ended:
				f.Action, f.Reason = gcKept, end.why
			case withinGrace(now.Sub(f.Written), end.grace):
				f.Action, f.Reason = gcKept, fmt.Sprintf("written %s ago, within the grace of %s", now.Sub(f.Written).Round(time.Second), end.grace)
			default:
				f.Action, f.Reason = gcWouldDelete, end.why
				doomed = append(doomed, f)
			}
		}
		if del && len(doomed) > 0 {
			failed = append(failed, deleteFolders(ctx, st, id, end, doomed)...)
		}
		for _, f := range folders[id] {
			if end.named[f.Folder] {
				continue
			}
			out.Folders = append(out.Folders, *f)
			if f.Action == gcWouldDelete || f.Action == gcDeleted {
				out.Objects += f.Objects
				out.Bytes += f.Bytes
			}
		}
	}
	if e.json() {
		if err := e.printJSON(out); err != nil {
			return err
		}
	} else {
		e.printGC(out)
	}
	if len(failed) > 0 {
		return fmt.Errorf("gc: could not delete %d objects (%s); what is left is listed again by the next gc", len(failed), strings.Join(failed, "; "))
	}
	return nil
}

// listAttemptFolders returns the attempt folders in the store by job id, sorted by name, each
// with its objects and unfinished uploads, their total size and the time the newest was
// written, and the unfinished uploads anywhere else in the store (strays). A folder of an
// attempt killed during its first upload holds an unfinished upload only.
func listAttemptFolders(ctx context.Context, st store.Store) (byJob map[string][]*gcFolder, strays []store.Partial, err error) {
	objects, err := st.List(ctx, "runs/")
	if err != nil {
		return nil, nil, err
	}
	partials, err := store.Partials(ctx, st, "")
	if err != nil {
		return nil, nil, err
	}
	folders := map[string]*gcFolder{}
	folderOf := func(key string, at time.Time, size int64) *gcFolder {
		id, folder, ok := attemptFolderOf(key)
		if !ok {
			return nil
		}
		f := folders[folder]
		if f == nil {
			f = &gcFolder{JobID: id, Folder: folder}
			folders[folder] = f
		}
		f.Bytes += size
		if at.After(f.Written) {
			f.Written = at
		}
		return f
	}
	for _, o := range objects {
		if f := folderOf(o.Key, o.ModTime, o.Size); f != nil {
			f.Objects++
			f.keys = append(f.keys, o.Key)
		}
	}
	for _, p := range partials {
		if f := folderOf(p.Key, p.Started, p.Size); f != nil {
			f.Partials++
			f.partials = append(f.partials, p)
		} else {
			strays = append(strays, p)
		}
	}
	byJob = map[string][]*gcFolder{}
	for _, name := range slices.Sorted(maps.Keys(folders)) {
		f := folders[name]
		byJob[f.JobID] = append(byJob[f.JobID], f)
	}
	return byJob, strays, nil
}

// gcUploads judges the unfinished uploads outside attempt folders, discards (with del) those
// nothing has written to for the grace, adds them to out and returns the discards that failed.
func gcUploads(ctx context.Context, st store.Store, strays []store.Partial, now time.Time, grace time.Duration, del bool, out *gcOutput) (failed []string) {
	out.Unfinished = make([]gcUpload, 0, len(strays))
	for _, p := range strays {
		u := gcUpload{Key: p.Key, Bytes: p.Size, Written: p.Started, partial: p,
			Action: gcWouldDelete, Reason: "an unfinished upload outside every attempt folder (a submit or a worker killed mid-upload)"}
		switch age := now.Sub(p.Started); {
		case withinGrace(age, grace):
			u.Action, u.Reason = gcKept, fmt.Sprintf("an unfinished upload written %s ago, within the grace of %s", age.Round(time.Second), grace)
		case del:
			u.Action = gcDeleted
			if err := store.DiscardPartial(ctx, st, p); err != nil {
				u.Action, u.Reason = gcDeleteFailed, err.Error()
				failed = append(failed, err.Error())
			}
		}
		if u.Action == gcWouldDelete || u.Action == gcDeleted {
			out.Bytes += u.Bytes
		}
		out.Unfinished = append(out.Unfinished, u)
	}
	return failed
}

// attemptFolderOf returns the job and the attempt folder (runs/<id>/attempts/<name>/) that key
// lies in; ok is false for a key outside every attempt folder or of no valid job id.
func attemptFolderOf(key string) (id, folder string, ok bool) {
	parts := strings.SplitN(key, "/", 5)
	if len(parts) < 5 || parts[0] != "runs" || parts[2] != "attempts" || !job.ValidID(parts[1]) {
		return "", "", false
	}
	return parts[1], store.AttemptPrefix(parts[1], parts[3]), true
}

// runEnd is what gc knows of a job: whether it ended, the folders its manifest names and the
// grace its other folders get.
type runEnd struct {
	ended     bool
	committed bool            // a manifest is committed
	why       string          // why its folders go, or, when it has not ended, why they stay
	named     map[string]bool // attempt folders the committed manifest names
	grace     time.Duration
}

// judgeEnd decides whether job id of tenant has ended: its manifest is committed (then no attempt can
// commit any more, and the manifest's subjects name the folders to keep), or, with no manifest,
// its status has been dead or failed for longer than the grace. Anything else, or anything gc
// cannot read for sure, keeps the job's folders.
func judgeEnd(ctx context.Context, st store.Store, q *queue.Client, tenant, id string, now time.Time, grace, ackWait time.Duration) (runEnd, error) {
	end := runEnd{named: map[string]bool{}, grace: grace}
	data, err := readObject(ctx, st, provenance.ManifestKey(id), maxManifestBytes)
	switch {
	case err == nil:
		stmt, err := provenance.Parse(data)
		if err == nil {
			err = stmt.CheckRun(tenant, id)
		}
		if err != nil {
			end.why = fmt.Sprintf("its manifest cannot be read (%v), so nothing tells which attempt committed", err)
			return end, nil
		}
		for _, s := range stmt.Subjects {
			if _, folder, ok := attemptFolderOf(provenance.SubjectKey(id, s)); ok {
				end.named[folder] = true
			}
		}
		m := stmt.Predicate
		// A stale attempt of a committed job can no longer commit; the grace still leaves
		// alone one that is writing into its own folder.
		end.grace = max(grace, time.Duration(m.Limits.JobTimeout)+ackWait)
		end.ended, end.committed = true, true
		end.why = fmt.Sprintf("not named by the committed manifest (job %s, attempt %d)", m.Outcome.State, m.Attempt)
		return end, nil
	case !errors.Is(err, store.ErrNotFound):
		return end, fmt.Errorf("read the manifest: %w", err)
	}
	s, err := q.Status(ctx, id)
	switch {
	case errors.Is(err, queue.ErrUnknownJob):
		end.why = "no manifest and no status: nothing tells whether the job ended"
		return end, nil
	case err != nil:
		return end, err
	}
	if s.State != job.StateDead && s.State != job.StateFailed {
		end.why = fmt.Sprintf("the job has not ended: no manifest is committed, its status is %s", orUnknown(s.State))
		return end, nil
	}
	if ended := cmp.Or(s.FinishedAt, s.UpdatedAt); withinGrace(now.Sub(ended), grace) {
		end.why = fmt.Sprintf("the job ended %s, with no manifest, %s ago, within the grace of %s", s.State, now.Sub(ended).Round(time.Second), grace)
		return end, nil
	}
	end.ended = true
	end.why = fmt.Sprintf("the job ended %s with no committed run", s.State)
	return end, nil
}

// withinGrace reports whether age, on gc's clock, of a time another machine's clock wrote (the
// store's, when it wrote an object; a worker's, when it ended a job), is within grace. That clock
// may be behind gc's: job.ClockSkew more keeps a folder a live attempt may still write.
func withinGrace(age, grace time.Duration) bool { return age <= grace+job.ClockSkew }

// deleteFolders removes the objects of folders, all of job id's, and returns the failures.
// For a job with no manifest it first looks again, so that an attempt that committed since
// the job was judged keeps its folder.
func deleteFolders(ctx context.Context, st store.Store, id string, end runEnd, folders []*gcFolder) (failed []string) {
	if !end.committed {
		_, err := st.Stat(ctx, provenance.ManifestKey(id))
		if !errors.Is(err, store.ErrNotFound) {
			why := "a manifest appeared while gc ran; run gc again"
			if err != nil {
				why = fmt.Sprintf("cannot check that the job is still uncommitted: %v", err)
			}
			for _, f := range folders {
				f.Action, f.Reason = gcKept, why
			}
			return nil
		}
	}
	for _, f := range folders {
		f.Action = gcDeleted
		fail := func(err error) {
			f.Action, f.Reason = gcDeleteFailed, err.Error()
			failed = append(failed, err.Error())
		}
		for _, k := range f.keys {
			if err := st.Delete(ctx, k); err != nil {
				fail(err)
			}
		}
		for _, p := range f.partials {
			if err := store.DiscardPartial(ctx, st, p); err != nil {
				fail(err)
			}
		}
		if err := store.PruneFolders(ctx, st, f.Folder); err != nil {
			fail(err)
		}
	}
	return failed
}

func (e *env) printGC(out gcOutput) {
	w := e.stdout
	verb := map[string]string{gcWouldDelete: "would delete", gcDeleted: "deleted", gcKept: "kept", gcDeleteFailed: "NOT DELETED"}
	folders := 0
	for _, f := range out.Folders {
		if f.Action == gcWouldDelete || f.Action == gcDeleted {
			folders++
		}
		what := count(f.Objects, "object")
		if f.Partials > 0 {
			what += ", " + count(f.Partials, "unfinished upload")
		}
		printf(w, "%-12s  %s  %s, %s, written %s: %s\n", verb[f.Action], f.Folder, what, sizeText(f.Bytes), f.Written.UTC().Format(time.RFC3339), f.Reason)
	}
	uploads := 0
	for _, u := range out.Unfinished {
		if u.Action == gcWouldDelete || u.Action == gcDeleted {
			uploads++
		}
		printf(w, "%-12s  %s  %s, written %s: %s\n", verb[u.Action], u.Key, sizeText(u.Bytes), u.Written.UTC().Format(time.RFC3339), u.Reason)
	}
	if uploads > 0 {
		printf(w, "%s outside attempt folders %s\n", count(uploads, "unfinished upload"), map[bool]string{true: "deleted", false: "would be deleted"}[out.Delete])
	}
	kept := len(out.Folders) - folders
	switch {
	case folders == 0:
		printf(w, "nothing to delete in %s (%s kept)\n", out.Store, count(kept, "unnamed attempt folder"))
	case out.Delete:
		printf(w, "deleted %s, %s, %s from %s; kept %d\n", count(folders, "folder"), count(out.Objects, "object"), sizeText(out.Bytes), out.Store, kept)
	default:
		printf(w, "would delete %s, %s, %s from %s; kept %d; nothing was deleted: give --delete to delete them\n", count(folders, "folder"), count(out.Objects, "object"), sizeText(out.Bytes), out.Store, kept)
	}
}

// count is "1 folder", "2 folders".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// sizeText is n bytes for people.
func sizeText(n int64) string {
	const k = 1 << 10
	switch {
	case n < k:
		return fmt.Sprintf("%d B", n)
	case n < k*k:
		return fmt.Sprintf("%.1f KiB", float64(n)/k)
	case n < k*k*k:
		return fmt.Sprintf("%.1f MiB", float64(n)/(k*k))
	default:
		return fmt.Sprintf("%.1f GiB", float64(n)/(k*k*k))
	}
}
