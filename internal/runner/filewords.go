package runner

import (
	"syscall"

	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// fileWords are why a file or folder of the job could not be taken, as the manifest says it
// (its report_error, a skipped file's detail), first match wins; anything else is
// fileFault. The job's own file errors are told by their class; the sandbox's text never: it
// names the worker's side (a host path, a pod, its node's address). The caller logs the
// error whole with the job's id. The one error told as it is (own) is the runner's own, made of
// the file's sizes (changedError). A new class is a new row.
var fileWords = wordTable{fallback: fileFault, rows: []wordRow{
	{name: "changed while uploaded", when: is[*changedError], own: true},
	{name: "too large", when: isErr(sandbox.ErrTooLarge), words: "larger than the worker takes"},
	{name: "not found", when: isErr(sandbox.ErrNotFound), words: "no such file"},
	{name: "escapes", when: isErr(sandbox.ErrPathEscape), words: "a link out of the workdir"},
	{name: "not a folder", when: isErr(sandbox.ErrNotDir), words: "not a folder"},
	{name: "permission", when: isErr(syscall.EACCES, syscall.EPERM), words: "permission denied"},
	{name: "name too long", when: isErr(syscall.ENAMETOOLONG), words: "name too long"},
	{name: "loop", when: isErr(syscall.ELOOP), words: "too many levels of symbolic links"},
	{name: "not regular", when: isErr(sandbox.ErrNotRegular, syscall.EISDIR), words: "not a regular file (a folder, a FIFO, a socket)"},
}}

// fileFault is what the manifest says of a file error no row of fileWords names.
const fileFault = "could not be read on the worker's side (the worker's log has the detail)"

// fileProblem is what the manifest says of err, the failure to read a file or folder of the
// job.
func fileProblem(err error) string {
	text, _ := fileWords.tell(err)
	return text
}

// changedError is a file that changed while it was being uploaded: not the size it was
// collected with (sourceReader).
type changedError struct{ text string }

func (e *changedError) Error() string { return e.text }
