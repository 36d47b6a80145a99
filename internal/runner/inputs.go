package runner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
)

// checkInputs refuses, before any sandbox starts, inputs that are not the tenant's.
func (r *Runner) checkInputs(a *attempt) error {
	return r.checkInputTenant(a)
}

// checkInputSize refuses, at admit, inputs that the profile cannot take: more bytes together
// than its max_input_bytes, as the job declares them (copyInputs holds each to its declared
// size).
func checkInputSize(a *attempt) error {
	limit := a.limits.MaxInputBytes
	if limit <= 0 {
		return nil
	}
	if total := inputBytes(a.job); total > limit {
		return fmt.Errorf("the job's inputs are %d bytes together, over the profile's max_input_bytes of %d; submit smaller inputs or use a profile that allows more: %w",
			total, limit, errInputTooLarge)
	}
	return nil
}

// inputBytes is the size of the job's inputs together, as it declares them, held at
// math.MaxInt64: sizes that add up past it would wrap below zero and pass any limit, and the
// sandbox would take the inputs before the one that cannot be what it says.
func inputBytes(j job.Job) int64 {
	var total int64
	for _, in := range j.Inputs {
		if in.Size > math.MaxInt64-total {
			return math.MaxInt64
		}
		total += in.Size
	}
	return total
}

// copyInputs streams each input from the store into the workdir, checking its size and
// digest on the way: no input is ever held whole in the worker's memory, and one that is not
// the bytes it names is not put in place.
func (r *Runner) copyInputs(ctx context.Context, a *attempt, sb sandbox.Sandbox) error {
	for _, in := range a.job.Inputs {
		rc, err := awaitAnswer(ctx, r, a, "the store", inputAnswered, func(ctx context.Context) (io.ReadCloser, error) {
			return a.store.Get(ctx, store.InputKey(in.SHA256))
		})
		if errors.Is(err, store.ErrNotFound) {
			return step(errInputMissing, fmt.Errorf("input %s (sha256 %s) is not in the store; submit it again: %w", in.Name, in.SHA256, err))
		}
		if errors.Is(err, store.ErrReadRefused) {
			return fmt.Errorf("input %s (sha256 %s): %w", in.Name, in.SHA256, err)
		}
		if err != nil {
			return step(errInputCopy, fmt.Errorf("fetch input %s: %w", in.Name, err))
		}
		src := newCheckedReader(rc, in)
		err = sb.WriteFrom(ctx, in.Name, src, in.Size)
		if err == nil {
			err = src.finish()
		}
		if src.err != nil {
			// The reader's verdict, whatever the sandbox made of it: a sandbox reads one byte
			// past the declared size to see the end, and says only that the source held more.
			err = src.err
		}
		rc.Close()
		if err != nil {
			return step(errInputCopy, fmt.Errorf("input %s into the sandbox: %w", in.Name, err))
		}
	}
	return nil
}

// checkedReader passes an input's bytes on and, at their end, fails with errInputMismatch
// unless they are exactly the declared size and digest. It fails as soon as it passes the
// declared size.
type checkedReader struct {
	r    io.Reader
	in   job.Input
	h    hash.Hash
	n    int64
	done bool
	err  error // the mismatch it found, once it found one
}

func newCheckedReader(r io.Reader, in job.Input) *checkedReader {
	return &checkedReader{r: r, in: in, h: sha256.New()}
}

func (c *checkedReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	if c.n > c.in.Size {
		return n, c.mismatch()
	}
	if errors.Is(err, io.EOF) {
		c.done = true
		if c.n != c.in.Size || hex.EncodeToString(c.h.Sum(nil)) != c.in.SHA256 {
			return n, c.mismatch()
		}
	}
	return n, err
}

// finish checks the end of a source its reader did not read to the end.
func (c *checkedReader) finish() error {
	if c.done {
		return nil
	}
	_, err := io.Copy(io.Discard, c)
	return err
}

func (c *checkedReader) mismatch() error {
	c.err = fmt.Errorf("%w: input %s is not the %d bytes of sha256 %s it names: the stored object changed, or the job gives its size or digest wrong", errInputMismatch, c.in.Name, c.in.Size, c.in.SHA256)
	return c.err
}

// inputAnswered: the store answered a read of an input (storeAnswered), or refused the worker
// that input alone (store.ErrReadRefused: a policy on its key, or its file's mode, while the
// worker reads the store's own object), which waiting does not change: the job fails, input_refused. The
// store refusing the worker every read is ErrWorkerRefused, waited for as an outage.
func inputAnswered(err error) bool { return storeAnswered(err) || errors.Is(err, store.ErrReadRefused) }
