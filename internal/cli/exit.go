package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"
)

// ExitError carries a process exit code out of a command, with the message to print (may be
// empty).
type ExitError struct {
	Code int
	Msg  string
}

func (e *ExitError) Error() string { return fmt.Sprintf("exit %d: %s", e.Code, e.Msg) }

// ExitCode is how a tool ends for err: 0 for none, the code an ExitError carries, else 1; and
// the message to print (empty for none), as it is: PrintError makes it safe for a terminal.
func ExitCode(err error) (code int, msg string) {
	var exit *ExitError
	switch {
	case err == nil:
		return 0, ""
	case errors.As(err, &exit):
		return exit.Code, exit.Msg
	default:
		return 1, err.Error()
	}
}

// PrintError writes msg to w as the tool name's error: each line of it (a config with three
// mistakes gives three) prefixed with "name: ", with control and format characters escaped
// (Escape), since a message can quote a config file or a job; so no line of it can pass for a
// line of the tool's own. An empty msg prints nothing.
func PrintError(w io.Writer, name, msg string) {
	if msg == "" {
		return
	}
	var b strings.Builder
	for line := range strings.SplitSeq(strings.TrimRight(msg, "\n"), "\n") {
		b.WriteString(name + ": " + Escape(line) + "\n")
	}
	_, _ = io.WriteString(w, b.String())
}
