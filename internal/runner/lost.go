package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// capDisk is the cap of a job whose sandbox was evicted for passing its disk bound (the
// profile's sandbox.disk): the job filled it.
const capDisk = "disk"

// lostWatch remembers the first call of the agent's that found the sandbox gone from outside
// (sandbox.ErrSandboxLost), whatever the agent made of it: the run then fails with the loss
// (run), never ends as the agent says. A model told its command "could not run" may well
// answer as if it were done.
type lostWatch struct {
	sandbox.Sandbox
	mu   sync.Mutex
	lost error
}

func watchLoss(sb sandbox.Sandbox) *lostWatch { return &lostWatch{Sandbox: sb} }

// Unwrap returns the sandbox beneath, for sandbox.As.
func (w *lostWatch) Unwrap() sandbox.Sandbox { return w.Sandbox }

// err is the sandbox's loss, nil while none was seen.
func (w *lostWatch) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lost
}

func (w *lostWatch) note(err error) {
	if !errors.Is(err, sandbox.ErrSandboxLost) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lost == nil {
		w.lost = err
	}
}

func (w *lostWatch) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	res, err := w.Sandbox.Exec(ctx, req)
	w.note(err)
	return res, err
}

func (w *lostWatch) WriteFile(ctx context.Context, name string, data []byte) error {
	err := w.Sandbox.WriteFile(ctx, name, data)
	w.note(err)
	return err
}

func (w *lostWatch) WriteFrom(ctx context.Context, name string, r io.Reader, size int64) error {
	err := w.Sandbox.WriteFrom(ctx, name, r, size)
	w.note(err)
	return err
}

func (w *lostWatch) ReadFile(ctx context.Context, name string, maxBytes int64) ([]byte, error) {
	data, err := w.Sandbox.ReadFile(ctx, name, maxBytes)
	w.note(err)
	return data, err
}

func (w *lostWatch) Open(ctx context.Context, name string, maxBytes int64) (io.ReadCloser, error) {
	rc, err := w.Sandbox.Open(ctx, name, maxBytes)
	w.note(err)
	return rc, err
}

func (w *lostWatch) List(ctx context.Context, dir string) ([]sandbox.FileInfo, error) {
	files, err := w.Sandbox.List(ctx, dir)
	w.note(err)
	return files, err
}

// runLost is the run's error once its sandbox was lost: the loss, unless the agent's own
// error already is one.
func runLost(w *lostWatch, err error) error {
	lost := w.err()
	if lost == nil || errors.Is(err, sandbox.ErrSandboxLost) {
		return err
	}
	return fmt.Errorf("the run lost its sandbox: %w", lost)
}

// lostOverDisk: the sandbox was lost for passing its disk bound (an eviction for the
// workdir's size), which the job caused.
func lostOverDisk(err, _ error) bool {
	return errors.Is(err, sandbox.ErrSandboxLost) && errors.Is(err, sandbox.ErrDiskFull)
}
