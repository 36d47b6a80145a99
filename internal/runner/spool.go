package runner

import (
	"context"
	"fmt"
	"io"
	"os"
)

// spool is the transcript as the agent writes it, in a file of the worker's temporary folder
// instead of memory: a job's transcript may be megabytes (max_transcript_bytes), and a worker
// runs many jobs. The file is unlinked as soon as it is made, so nothing is left behind
// however the worker ends; the open handle keeps it until the attempt is over.
type spool struct {
	f    *os.File
	size int64
	err  error // the first write that failed: the transcript is incomplete
}

func (r *Runner) newSpool() (*spool, error) {
	f, err := os.CreateTemp(r.cfg.TempDir, "boxcar-transcript-*.jsonl")
	if err != nil {
		return nil, fmt.Errorf("spool the transcript: %w; give the worker a writable temporary folder (TMPDIR)", err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("spool the transcript: %w", err)
	}
	return &spool{f: f}, nil
}

// Write appends to the spool; after a failure it takes nothing more.
func (s *spool) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.f.Write(p)
	s.size += int64(n)
	if err != nil {
		s.err = fmt.Errorf("spool the transcript: %w", err)
	}
	return n, s.err
}

// output is the transcript as written so far, read back from the file on each try of the
// commit. One whose spool failed cannot be uploaded: the run is retried rather than committed
// with a transcript cut short.
func (s *spool) output() output {
	size := s.size
	return output{name: transcriptName, size: size, open: func(context.Context) (io.ReadCloser, error) {
		if s.err != nil {
			return nil, s.err
		}
		return io.NopCloser(io.NewSectionReader(s.f, 0, size)), nil
	}}
}

func (s *spool) close() { s.f.Close() }
