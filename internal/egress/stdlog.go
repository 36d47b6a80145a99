package egress

import (
	"bytes"
	"log"
	"log/slog"
	"regexp"
)

// net/http's Transport, the upstream side of terminated tunnels, writes to the standard
// logger, and quotes what it writes from the upstream: bytes a kept-alive connection receives
// while no request is outstanding ("Unsolicited response received on idle HTTP channel
// starting with ..."), such as the body a bound host sends with its answer to HEAD or past its
// Content-Length. Those bytes are the host's answer before any scrubbing, so they may hold a
// secret's value the host quotes back (a 401 quoting the Authorization it got), and the
// sandbox chooses the method. The Transport has no logger of its own to give it: the standard
// logger is the process's, so the worker routes it once, at start, through CaptureStdLog.

// shortFile is the "file.go:123" that log.Lshortfile puts before a line's text.
var shortFile = regexp.MustCompile(`^[A-Za-z0-9_.-]+\.go:[0-9]+$`)

// CaptureStdLog routes the standard logger (package log), process-wide, to l: each line a
// library writes there becomes one warning that names the file and line that wrote it and
// quotes none of its text, which may be a bound host's unscrubbed answer. Call it once, from
// the worker's wiring, before any proxy serves.
func CaptureStdLog(l *slog.Logger) {
	log.SetPrefix("")
	log.SetFlags(log.Lshortfile)
	log.SetOutput(stdLogWriter{l})
}

// stdLogWriter is the standard logger's output once CaptureStdLog has run.
type stdLogWriter struct{ l *slog.Logger }

func (w stdLogWriter) Write(p []byte) (int, error) {
	source := "unknown"
	if i := bytes.Index(p, []byte(": ")); i > 0 && shortFile.Match(p[:i]) {
		source = string(p[:i])
	}
	w.l.Warn("a library wrote to the standard logger; its text is not shown, for it may quote a bound host's answer before scrubbing (a secret's value)",
		"source", source)
	return len(p), nil
}
