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
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/store"
)

// maxInputBytes bounds one input file; larger data belongs in the store, not a batch job.
const maxInputBytes = 256 << 20

// uploadParallel is how many inputs are read and uploaded at once; each is held in memory
// while it is, so this also bounds memory (4 × maxInputBytes).
const uploadParallel = 4

// checkInput fails early, before anything is sent, for a path that cannot be an input.
func checkInput(name string) error {
	fi, err := os.Stat(name)
	switch {
	case err != nil:
		return fmt.Errorf("run: input %s: %w", name, err)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("run: input %s is not a regular file", name)
	case fi.Size() > maxInputBytes:
		return fmt.Errorf("run: input %s is %d bytes; the limit is %d", name, fi.Size(), maxInputBytes)
	}
	return nil
}

// inputsBytes is the size of the files at paths together, as checkInput found them: what the
// job will declare, which a profile's max_input_bytes bounds.
func inputsBytes(paths []string) int64 {
	var total int64
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil {
			total += fi.Size()
		}
	}
	return total
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
	// Read whole, so what is hashed is exactly what is uploaded even if the file changes.
	data, err := io.ReadAll(io.LimitReader(f, maxInputBytes+1))
	if err != nil {
		return nil, fmt.Errorf("run: input %s: %w", name, err)
	}
	if len(data) > maxInputBytes {
		return nil, fmt.Errorf("run: input %s grew past the limit of %d bytes while it was read", name, maxInputBytes)
	}
	return data, nil
}

// uploadInputs puts every distinct file of paths into the store under its SHA-256, once per
// digest however many jobs or paths name it, and returns each path's job.Input (Name is the
// file's base name). A digest the store already holds is not sent again.
func uploadInputs(ctx context.Context, st store.Store, paths []string) (map[string]job.Input, error) {
	var (
		mu   sync.Mutex
		out  = make(map[string]job.Input, len(paths))
		sent = map[string]bool{} // digests this call already checked or uploaded
	)
	unique := make([]string, 0, len(paths))
	for _, p := range paths {
		if _, ok := out[p]; !ok {
			out[p] = job.Input{}
			unique = append(unique, p)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(uploadParallel)
	for _, p := range unique {
		g.Go(func() error {
			data, err := readInput(p)
			if err != nil {
				return localInputError{err}
			}
			sum := sha256.Sum256(data)
			in := job.Input{Name: filepath.Base(p), SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data))}
			key := store.InputKey(in.SHA256)
			in.URI = st.URL(key)
			mu.Lock()
			out[p] = in
			first := !sent[in.SHA256]
			sent[in.SHA256] = true
			mu.Unlock()
			if !first {
				return nil
			}
			if err := putInput(gctx, st, key, data); err != nil {
				return fmt.Errorf("run: upload input %s: %w", p, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}

// putInput stores data under its digest key unless the store has it: a content-addressed
// object of the right size is the same bytes, so it is not sent again. One of another size is
// not the input (cut short by a tool that copied the store, or put there by another writer):
// it is replaced, which create-only could not do, so that the job does not fail at the worker
// as input_digest_mismatch, and every submission of it again.
func putInput(ctx context.Context, st store.Store, key string, data []byte) error {
	info, err := st.Stat(ctx, key)
	switch {
	case err == nil && info.Size == int64(len(data)):
		return nil
	case err == nil:
		return st.Put(ctx, key, bytes.NewReader(data), int64(len(data)))
	case !errors.Is(err, store.ErrNotFound):
		return err
	}
	err = st.PutIfAbsent(ctx, key, bytes.NewReader(data), int64(len(data)))
	if errors.Is(err, store.ErrExists) {
		return nil
	}
	return err
}

// validateBefore checks j as a worker will, with stand-ins for the inputs at paths still to
// upload (their names), so that a bad profile name, label key, id or input name is refused
// before NATS or the store is asked: run refused them once the inputs were uploaded, a profile
// name no job can give as an unknown profile (exit 4).
func validateBefore(j job.Job, paths []string) error {
	for _, p := range paths {
		j.Inputs = append(j.Inputs, job.Input{Name: filepath.Base(p), URI: "check", SHA256: strings.Repeat("0", 64)})
	}
	return j.Validate()
}
