package submitcmd

import (
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/boxcar-run/boxcar/internal/cli"
)

// clean makes text that came from a job or a model (tool names, errors, progress, labels, ids
// read from the store) safe to print on a terminal; see cli.Escape.
func clean(s string) string { return cli.Escape(s) }

// safeWriter is every stream submit prints to: whatever a job or a model put in a status, a
// manifest or an object name, no control or format character reaches the terminal. It writes
// newlines and tabs as they are (submit's own layout) and escapes everything else clean does,
// which keeps JSON output valid: an escape like \u202e inside a JSON string means the same
// character. Text fields that come from a job are also passed through clean, so a newline in
// them cannot start a line of its own. Writes may come from two goroutines (a word that NATS
// was lost comes from the connection's), each whole.
type safeWriter struct {
	mu   sync.Mutex
	w    io.Writer
	part []byte // the start of a UTF-8 sequence split across two writes
}

func (s *safeWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	data := p
	if len(s.part) > 0 {
		data = slices.Concat(s.part, p)
		s.part = nil
	}
	var b strings.Builder
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		switch {
		case r == utf8.RuneError && size <= 1 && !utf8.FullRune(data[i:]):
			s.part = append([]byte(nil), data[i:]...)
			i = len(data)
			continue
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, data[i])
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case cli.Unsafe(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.Write(data[i : i+size])
		}
		i += size
	}
	if _, err := io.WriteString(s.w, b.String()); err != nil {
		return 0, err
	}
	return len(p), nil
}

// printf is fmt.Fprintf with every string, error and Stringer argument passed through clean:
// the format is submit's, the arguments may come from a job or the store. An error quotes
// keys and names as it found them, and the stream keeps a newline as it is (submit's own
// layout), so one in an error would start a line of the store's choosing.
func printf(w io.Writer, format string, args ...any) {
	for i, a := range args {
		switch v := a.(type) {
		case error:
			args[i] = clean(v.Error())
		case fmt.Stringer:
			args[i] = clean(v.String())
		default:
			if v := reflect.ValueOf(a); v.IsValid() && v.Kind() == reflect.String {
				args[i] = clean(v.String())
			}
		}
	}
	fmt.Fprintf(w, format, args...)
}
