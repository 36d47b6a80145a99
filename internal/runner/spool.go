package runner

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
)

// spoolMemory is how much of a transcript stays in memory before it moves to a file. Most
// transcripts are smaller, and each file costs a create and an unlink on the job's path
// (about 150 µs of a trivial job's 1.2 ms on ext4, row 1).
const spoolMemory = 64 << 10

// spool is the transcript as the agent writes it: in memory up to spoolMemory, then in a file
// of the worker's temporary folder, since a job's transcript may be megabytes
// (max_transcript_bytes) and a worker runs many jobs. The file is unlinked as soon as it is
// made, so nothing is left behind however the worker ends; the open handle keeps it until the
// attempt is over.
type spool struct {
	dir  string
	mem  []byte   // the transcript while it is small
	f    *os.File // the transcript once it is not
	size int64
	err  error // the first write that failed: the transcript is incomplete
}

func (r *Runner) newSpool() *spool { return &spool{dir: r.cfg.TempDir} }

// Write appends to the spool; after a failure it takes nothing more.
func (s *spool) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	if s.f == nil && len(s.mem)+len(p) <= spoolMemory {
		s.mem = append(s.mem, p...)
		s.size += int64(len(p))
		return len(p), nil
	}
	if s.f == nil {
		if s.err = s.spill(); s.err != nil {
			return 0, s.err
		}
	}
	n, err := s.f.Write(p)
	s.size += int64(n)
	if err != nil {
		s.err = fmt.Errorf("spool the transcript: %w", err)
	}
	return n, s.err
}

// spill moves the transcript so far to an unlinked file.
func (s *spool) spill() error {
	f, err := createUnlinked(s.dir)
	if err != nil {
		return fmt.Errorf("spool the transcript: %w", err)
	}
	if _, err := f.Write(s.mem); err != nil {
		f.Close()
		return fmt.Errorf("spool the transcript: %w", err)
	}
	s.f, s.mem = f, nil
	return nil
}

// createUnlinked makes a file in dir that has no name: it goes when its handle is closed.
func createUnlinked(dir string) (*os.File, error) {
	f, err := os.CreateTemp(dir, "boxcar-transcript-*.jsonl")
	if err != nil {
		return nil, fmt.Errorf("%w; give the worker a writable temporary folder (TMPDIR)", err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// output is the transcript as written so far, read back on each try of the commit from where
// it is when the try opens it. One whose spool failed cannot be uploaded: the run is retried
// rather than committed with a transcript cut short.
func (s *spool) output() output {
	size := s.size
	return output{name: transcriptName, size: size, open: func(context.Context) (io.ReadCloser, error) {
		switch {
		case s.err != nil:
			return nil, s.err
		case s.f != nil: // the file starts with what was in memory
			return io.NopCloser(io.NewSectionReader(s.f, 0, size)), nil
		}
		return io.NopCloser(bytes.NewReader(s.mem[:size])), nil
	}}
}

func (s *spool) close() {
	if s.f != nil {
		s.f.Close()
	}
}
