package runner

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
)

// Bounds on what a job can leave behind.
const (
	maxManifestBytes = 16 << 20
	maxReportBytes   = 4 << 20
	maxArtifacts     = provenance.MaxArtifacts
	maxArtifactBytes = 64 << 20
	maxArtifactTotal = 256 << 20
)

// output is one file the run leaves in the store, named relative to the attempt's folder. It
// is never held whole: open streams it from where it is (the sandbox, the transcript's spool,
// memory for the report) on each try of the commit, and the upload hashes it on the way.
type output struct {
	name string
	size int64
	open func(ctx context.Context) (io.ReadCloser, error)
	// path is the file's path in the workdir for an artifact the job left, "" otherwise. An
	// artifact that cannot be read as it was listed (it changed, it became a link, the
	// sandbox is gone) is left out and named in the manifest instead of failing the commit.
	path string
	// render, when set, makes the output's bytes at the commit from what the commit leaves
	// out, after every other output of the run was uploaded (open and size are unset): the
	// worker's summary report counts the artifacts left out at the upload too.
	render func(provenance.Collected) []byte
}

// memOutput is an output held in memory: the report, a transcript of one line.
func memOutput(name string, data []byte) output {
	return output{name: name, size: int64(len(data)), open: func(context.Context) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}}
}

// stored is an output as the store took it, for the manifest's subjects.
type stored struct {
	name   string
	sha256 string
	size   int64
}

// sourceError is an output that could not be read as it was when the run was collected; the
// store kept nothing of it (a put whose body fails or is not of its declared size writes
// nothing).
type sourceError struct{ err error }

func (e *sourceError) Error() string { return e.err.Error() }
func (e *sourceError) Unwrap() error { return e.err }

// sourceReader passes an output's bytes to the store and fails, remembering why, when the
// source fails or holds other than the size it was collected with.
type sourceReader struct {
	r    io.Reader
	want int64
	n    int64
	err  error
}

func (s *sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	s.n += int64(n)
	switch {
	case s.n > s.want:
		n -= int(s.n - s.want)
		s.n = s.want
		err = &changedError{fmt.Sprintf("more than the %d bytes it had when collected: it changed while being uploaded", s.want)}
	case err == nil:
		return n, nil
	case errors.Is(err, io.EOF) && s.n == s.want:
		return n, err
	case errors.Is(err, io.EOF):
		err = &changedError{fmt.Sprintf("%d bytes, %d when collected: it changed while being uploaded", s.n, s.want)}
	}
	s.err = err
	return n, err
}

// upload streams out into key, create-only, and returns its digest, that of exactly the bytes
// the store took. Nothing of it is held in memory but the store's own buffer (one S3 part). A
// put whose answer was lost after the store took it is a success (store.PutOnce): the object
// is these bytes.
func (r *Runner) upload(ctx context.Context, a *attempt, key string, out output) (stored, error) {
	rc, err := out.open(ctx)
	if err != nil {
		return stored{}, &sourceError{err}
	}
	defer rc.Close()
	src := &sourceReader{r: rc, want: out.size}
	got, err := store.PutOnce(ctx, a.store, key, src, out.size)
	if err != nil {
		if src.err != nil {
			return stored{}, &sourceError{src.err}
		}
		return stored{}, err
	}
	if got.Size != out.size {
		// The store took a body of another length than declared: its digest would not be
		// the object's.
		return stored{}, fmt.Errorf("the store took %d bytes of %d", got.Size, out.size)
	}
	return stored{name: out.name, sha256: got.SHA256, size: got.Size}, nil
}

// commit uploads the run into the attempt's own folder, every object create-only, then the
// manifest, which names those objects with their digests, with a create-only put. The manifest
// is the commit marker: once it exists the run is final, and a stale attempt that comes second
// gets errLeaseLost. Since no attempt writes outside its own folder, and the manifest names only
// the folder of the attempt that committed, nothing a later or stale attempt writes can change
// a committed run. A folder left by an attempt that lost is removed, as far as this worker
// can, but never while the manifest naming it may be stored: each create-only put reads back
// what the store holds when its answer is lost (putSettled), and a put of this manifest that
// could not be settled leaves the folder alone. See docs/lifecycle.md for what a crash leaves.
//
// It returns the committed report's key, "" when the run committed none.
func (r *Runner) commit(ctx context.Context, a *attempt, run ran, outs []output, c provenance.Collected, o outcome) (reportKey string, err error) {
	// A newer attempt means this one's ack deadline passed and another worker took the job:
	// uploading now would only leave objects nothing names.
	if err := r.checkLease(ctx, a); err != nil {
		return "", err
	}
	folder, err := attemptFolder(a.d.Attempt)
	if err != nil {
		return "", err
	}
	outs = append(outs, run.transcript)
	// Each try of the commit starts from what collect found: an artifact left out because it
	// changed during an earlier try is named once, and only if it fails again.
	collected := c
	collected.Skipped = slices.Clone(collected.Skipped)
	var written []string
	defer func() {
		if err != nil {
			r.discard(ctx, a, written)
		}
	}()
	subs, err := r.uploadAll(ctx, a, folder, outs, &collected, &written)
	if err != nil {
		return "", err
	}
	// The run's commit is the manifest's create-only put, which a run committed meanwhile
	// refuses: only the attempt is checked here, so that one whose upload outlasted its lease
	// does not commit over the attempt that runs now.
	if err := r.checkAttempt(ctx, a); err != nil {
		return "", err
	}
	manifest, err := r.manifest(a, run, folder, subs, collected, decide(o, a.d.LastAttempt()), o.err)
	if err != nil {
		return "", err
	}
	env, err := r.leaveSignature(ctx, a, folder, manifest, &written)
	if err != nil {
		return "", err
	}
	if err := r.putManifest(ctx, a, manifest); err != nil {
		if errors.Is(err, store.ErrMaybeStored) {
			// The manifest may be stored, or land later: what it names stays, and the
			// redelivery that finds it adopts it. Nothing else can name this folder.
			written = nil
		}
		return "", err
	}
	written = nil // named by the committed manifest: never removed
	if slices.ContainsFunc(subs, func(s stored) bool { return s.name == reportName }) {
		reportKey = store.AttemptPrefix(a.job.ID, folder) + reportName
	}
	if env != nil {
		// Create-only like the manifest: a signature, once there, is never replaced.
		if err := putSettled(ctx, r, a, store.SignatureKey(a.job.ID), env); err != nil && !errors.Is(err, store.ErrExists) {
			return reportKey, fmt.Errorf("upload manifest signature: %w", err)
		}
	}
	return reportKey, nil
}

// leaveSignature signs the manifest before it commits the run, so that a run is never committed
// by a worker that cannot sign it, and leaves the envelope in the attempt's folder, adding its key
// to written: a worker that finds the run committed without its signature copies that one into
// place (restoreSignature), it never signs a manifest it did not build. Without a signing key
// it returns no envelope.
func (r *Runner) leaveSignature(ctx context.Context, a *attempt, folder string, manifest []byte, written *[]string) ([]byte, error) {
	if r.cfg.SigningKey == nil {
		return nil, nil
	}
	env, err := signManifest(ctx, manifest, r.cfg.SigningKey)
	if err != nil {
		return nil, fmt.Errorf("sign manifest: %w", err)
	}
	key := store.AttemptSignatureKey(a.job.ID, folder)
	*written = append(*written, key) // removed if the commit fails, whether or not it took
	if err := putSettled(ctx, r, a, key, env); err != nil {
		return nil, fmt.Errorf("upload manifest signature: %w", storeFailure(ctx, err))
	}
	return env, nil
}

// putManifest commits the run: the manifest's create-only put (putSettled). It succeeds once
// the manifest stored is this one, also when the put's answer was lost after the store took it
// and the store's client, retrying, was refused; another attempt's manifest is errLeaseLost.
// Until the store says which, the run may be committed, and the commit can neither remove what
// it wrote nor start over in another folder: given up unsettled (the attempt's deadline, a
// shutdown), the error wraps store.ErrMaybeStored.
func (r *Runner) putManifest(ctx context.Context, a *attempt, manifest []byte) error {
	err := putSettled(ctx, r, a, store.ManifestKey(a.job.ID), manifest)
	if errors.Is(err, store.ErrExists) {
		return fmt.Errorf("%w: another attempt committed the run first", errLeaseLost)
	}
	return storeFailure(ctx, err)
}

// putSettled puts data under key create-only (store.PutOnce) and, while the store cannot say
// whether a put took (no answer, and nothing to read back yet), puts the same bytes again until
// it can (awaitAnswer): a put still on its way then lands on its own bytes, not beside a
// second try of the commit. Once a put may have been stored, a later one the store answers
// without storing it (a refusal, a token expired meanwhile) settles nothing: the first may
// still land, naming what the commit would otherwise remove.
func putSettled(ctx context.Context, r *Runner, a *attempt, key string, data []byte) error {
	maybe := false
	_, err := awaitAnswerTo(ctx, r, a, "the store", "before the run can be committed", storeSettled, func(ctx context.Context) (store.Digest, error) {
		d, err := store.PutOnce(ctx, a.store, key, bytes.NewReader(data), int64(len(data)))
		switch {
		case errors.Is(err, store.ErrMaybeStored):
			maybe = true
		case err != nil && maybe && !errors.Is(err, store.ErrExists):
			err = fmt.Errorf("%w; an earlier put of the same bytes may yet land: %w", err, store.ErrMaybeStored)
		}
		return d, err
	})
	return err
}

// storeSettled: the store said whether the create-only put took (store.PutOnce).
func storeSettled(err error) bool { return !errors.Is(err, store.ErrMaybeStored) }

// storeFailure marks a failed store call as the store being down (waited out, retried) unless
// the attempt was stopped, the server cannot keep a run safe, or it refused the write for want
// of permission (store.ErrWriteRefused) with no earlier put of it that may yet land: waiting
// would not change that, and the run ends with "store refuses the run's writes".
func storeFailure(ctx context.Context, err error) error {
	refused := errors.Is(err, store.ErrWriteRefused) && !errors.Is(err, store.ErrMaybeStored) // an earlier put may land yet
	if err != nil && ctx.Err() == nil && !errors.Is(err, store.ErrUnsafeServer) && !refused {
		return &storeDownError{err}
	}
	return err
}

// uploadAll uploads the run's outputs into the attempt's folder and returns what the store
// took, adding each key to written before its put. What is rendered goes last, once every artifact
// has been uploaded or left out; an artifact that does not read as it was listed is left out
// and named in collected.
func (r *Runner) uploadAll(ctx context.Context, a *attempt, folder string, outs []output, collected *provenance.Collected, written *[]string) ([]stored, error) {
	var first, last []output
	for _, out := range outs {
		if out.render != nil {
			last = append(last, out)
		} else {
			first = append(first, out)
		}
	}
	var subs []stored
	for _, out := range append(first, last...) {
		if out.render != nil {
			out = memOutput(out.name, out.render(*collected))
		}
		key := store.AttemptPrefix(a.job.ID, folder) + out.name
		// An output whose put may have taken is uploaded again, the same bytes, until the
		// store says (putSettled). It is removed with the rest if the commit fails.
		*written = append(*written, key)
		// The error names the output in the wait's status line too ("waiting for the store:
		// upload report.md: ...").
		got, err := awaitAnswerTo(ctx, r, a, "the store", "before the run can be committed", storeSettled, func(ctx context.Context) (stored, error) {
			got, err := r.upload(ctx, a, key, out)
			if err != nil {
				err = fmt.Errorf("upload %s: %w", out.name, err)
			}
			return got, err
		})
		var source *sourceError
		switch {
		case err == nil:
		case errors.Is(err, sandbox.ErrSandboxLost):
			return nil, err // nothing more of the run can be read: it is not committed
		case out.path != "" && errors.As(err, &source) && ctx.Err() == nil:
			skip(collected, out.path, "changed", fileProblem(source))
			a.log.WarnContext(ctx, "artifact changed while being uploaded or cannot be read; not uploaded", "artifact", out.path, "error", source)
			continue
		case errors.As(err, &source):
			return nil, err
		default:
			return nil, storeFailure(ctx, err)
		}
		subs = append(subs, got)
		r.m.UploadedBytes.Add(float64(got.size))
	}
	return subs, nil
}

// commitWhenSafe commits the run, and when the store does not take its writes (it is down:
// storeDownError) or refuses them because its server stopped refusing a second create-only put
// (the proof the store repeats failed: store.ErrUnsafeServer) waits, keeping the delivery, and
// commits again, into a new folder, once it does. What a failed try wrote is removed. Handing
// the job back would spend a delivery and throw the run away, and no other attempt could
// commit either. The wait is bounded as awaitAnswer's, after which the error is the attempt's.
func (r *Runner) commitWhenSafe(ctx context.Context, a *attempt, run ran, outs []output, c provenance.Collected, o outcome) (reportKey string, err error) {
	return awaitAnswerTo(ctx, r, a, "the store", "before the run can be committed", storeTookIt, func(ctx context.Context) (string, error) {
		return r.commit(ctx, a, run, outs, c, o)
	})
}

// storeDownError is a write of the commit the store did not take, for want of an answer or
// with an error of its own: unlike a lost lease or an output that changed, it passes when the
// store does.
type storeDownError struct{ err error }

func (e *storeDownError) Error() string { return e.err.Error() }
func (e *storeDownError) Unwrap() error { return e.err }

// storeTookIt: the commit did not fail for the store's sake.
func storeTookIt(err error) bool {
	var down *storeDownError
	return storeSafe(err) && !errors.As(err, &down)
}

// attemptFolder names the folder of one attempt's objects: its delivery number, for people,
// and a random part, so that two attempts never share a folder even when the server counts
// deliveries again from 1 (a stream restored from a backup, a consumer created anew).
func attemptFolder(attempt int) (string, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("name the attempt folder: %w", err)
	}
	return fmt.Sprintf("%d-%s", attempt, hex.EncodeToString(b[:])), nil
}

// discard removes the objects an attempt wrote and no manifest names. It is best effort:
// what it cannot remove stays unnamed, which `submit verify` lists as such.
func (r *Runner) discard(ctx context.Context, a *attempt, keys []string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CleanupTimeout)
	defer cancel()
	for _, k := range keys {
		if err := a.store.Delete(ctx, k); err != nil {
			a.log.WarnContext(ctx, "remove an object of an attempt that did not commit", "url", a.store.URL(k), "error", err)
		}
	}
}

// The names of the report and the transcript in the run's folder and among the manifest's
// subjects.
const (
	reportName     = "report.md"
	transcriptName = "transcript.jsonl"
)

// mayHaveLostLease tells whether another attempt could have taken the job over: not before
// half the ack wait, since the server delivers a job again only after a whole ack wait without
// a heartbeat. Where it could not, the lease checks are round trips with nothing to find. An
// attempt paused in a way its clock did not count (a suspended machine) may still find at its
// commit that another attempt runs or committed: the manifest's create-only put decides
// between them, and the job ends once either way (see docs/lifecycle.md).
func (a *attempt) mayHaveLostLease() bool {
	return time.Since(a.began) >= a.d.AckWait()/2
}

// checkLease fails with errLeaseLost when a later attempt of the job has started or the run
// is already committed; it asks only an attempt that may have lost its lease.
// It waits out an outage of NATS or the store (awaitAnswer): the attempt has done its work by
// now, and failing it for a blip would throw that work away, or, on the last delivery,
// dead-letter a job that ran.
func (r *Runner) checkLease(ctx context.Context, a *attempt) error {
	if !a.mayHaveLostLease() {
		return nil
	}
	if err := r.checkAttempt(ctx, a); err != nil {
		return err
	}
	_, err := awaitAnswerTo(ctx, r, a, "the store", "before the run can be committed", storeAnswered, func(ctx context.Context) (store.ObjectInfo, error) {
		return a.store.Stat(ctx, store.ManifestKey(a.job.ID))
	})
	switch {
	case err == nil:
		return fmt.Errorf("%w: the run is already committed", errLeaseLost)
	case !errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("check whether the run is committed: %w", err)
	}
	return nil
}

// checkAttempt fails with errLeaseLost when a later attempt of the job has started; like
// checkLease it asks only an attempt that may have lost its lease, and waits out an outage.
func (r *Runner) checkAttempt(ctx context.Context, a *attempt) error {
	if !a.mayHaveLostLease() {
		return nil
	}
	st, err := awaitAnswerTo(ctx, r, a, "NATS", "before the run can be committed", statusAnswered, func(ctx context.Context) (job.Status, error) {
		return r.cfg.Queue.Status(ctx, a.ref(a.job.ID))
	})
	if err != nil && !errors.Is(err, queue.ErrUnknownJob) {
		return fmt.Errorf("check the job is still ours: %w", err)
	}
	if st.Attempt > a.d.Attempt {
		return fmt.Errorf("%w: attempt %d started after this attempt (%d)", errLeaseLost, st.Attempt, a.d.Attempt)
	}
	return nil
}

// adoptCommitted finishes what the attempt that committed the run may not have: the manifest's
// signature (it stopped between the two) and the job's final status (it stopped before the ack).
// Like checkLease it waits out an outage: a delivery that gave up here would be handed back
// and spend a delivery of a job that is already done.
func (r *Runner) adoptCommitted(ctx context.Context, a *attempt) (provenance.Outcome, error) {
	jobID := a.job.ID
	rc, err := awaitAnswerTo(ctx, r, a, "the store", "before the job can end", storeAnswered, func(ctx context.Context) (io.ReadCloser, error) {
		return a.store.Get(ctx, store.ManifestKey(jobID))
	})
	if err != nil {
		return provenance.Outcome{}, err
	}
	manifest, err := io.ReadAll(io.LimitReader(rc, maxManifestBytes))
	rc.Close()
	if err != nil {
		return provenance.Outcome{}, err
	}
	stmt, err := provenance.Parse(manifest)
	if err == nil {
		// A manifest of another job or tenant put there by hand is no run of this job: the
		// job is not ended as it says, nor is its signature restored.
		err = stmt.CheckRun(a.tenant, jobID)
	}
	if err != nil {
		return provenance.Outcome{}, fmt.Errorf("read the committed manifest: %w", err)
	}
	unsigned, err := r.restoreSignature(ctx, a, stmt)
	if err != nil {
		return provenance.Outcome{}, fmt.Errorf("restore the committed manifest's signature: %w", err)
	}
	// The status tells what is committed: the attempt, worker and times that produced the
	// manifest, not those of this delivery or of one that failed before it.
	m := stmt.Predicate
	out := m.Outcome
	_, err = awaitAnswerTo(ctx, r, a, "NATS", "before the job can end", natsAnswered, func(ctx context.Context) (job.Status, error) {
		return r.cfg.Queue.UpdateStatus(ctx, a.ref(jobID), func(s *job.Status) {
			s.State, s.Cap, s.Error, s.Progress = out.State, out.Cap, out.Error, ""
			if s.State.Terminal() {
				a.leftAsked = leaveAsked(s, time.Now())
			}
			s.Attempt, s.Worker = m.Attempt, m.Worker.ID
			s.StartedAt, s.FinishedAt = m.Timings.StartedAt, m.Timings.FinishedAt
			s.SandboxClaimedAt, s.SandboxWarm = m.Sandbox.ClaimedAt, m.Sandbox.Warm
			s.Report, s.Manifest, s.Unsigned = "", a.store.URL(store.ManifestKey(jobID)), unsigned
			if i := slices.IndexFunc(stmt.Subjects, func(s provenance.Subject) bool { return s.Name == reportName }); i >= 0 {
				s.Report = a.store.URL(provenance.SubjectKey(jobID, stmt.Subjects[i]))
			}
		})
	})
	if errors.Is(err, queue.ErrFinal) {
		err = nil
	}
	return out, err
}

// restoreSignature copies the envelope the committing attempt left in its folder into place
// when the run was committed without it (its worker stopped between the two puts). It never
// signs: the manifest in the store may not be one a worker built, and signing it would sign
// whatever someone who can write to the store put there. A committed run whose attempt left no
// envelope (a worker without a signing key, or a manifest no worker wrote), or whose envelope
// the store refuses this worker's copy of, stays unsigned, and `submit verify` says so; a
// worker that signs warns about it. refused says the envelope is there and the store refused
// its copy: the job's status marks the run unsigned (job.Status.Unsigned).
func (r *Runner) restoreSignature(ctx context.Context, a *attempt, stmt provenance.Statement) (refused bool, err error) {
	jobID := a.job.ID
	if _, err := a.store.Stat(ctx, store.SignatureKey(jobID)); !errors.Is(err, store.ErrNotFound) {
		return false, err // signed already, or the store cannot tell
	}
	unsigned := func(why string, args ...any) {
		level := slog.LevelDebug
		if r.cfg.SigningKey != nil {
			level = slog.LevelWarn
		}
		a.log.Log(ctx, level, why+"; the run stays unsigned", args...)
	}
	key := provenance.AttemptSignatureKey(jobID, stmt)
	if key == "" {
		unsigned("the committed manifest names no attempt folder, so no signature of it can be restored")
		return false, nil
	}
	rc, err := a.store.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		unsigned("the committed manifest has no signature and its attempt left none", "envelope", a.store.URL(key))
		return false, nil
	} else if err != nil {
		return false, err
	}
	env, err := io.ReadAll(io.LimitReader(rc, maxManifestBytes))
	rc.Close()
	if err != nil {
		return false, err
	}
	_, err = store.PutOnce(ctx, a.store, store.SignatureKey(jobID), bytes.NewReader(env), int64(len(env)))
	switch {
	case errors.Is(err, store.ErrExists):
		return false, nil // another worker restored it first
	case errors.Is(err, store.ErrWriteRefused):
		// No delivery of a worker the store refuses could copy it: the run is the job's end
		// all the same, and one the store takes may still sign it.
		unsigned("the store refuses the worker's copy of the envelope into place", "envelope", a.store.URL(key), "error", err)
		return true, nil
	}
	return false, err
}
