package sandbox

import (
	"errors"
	"strings"
	"syscall"
	"testing"
)

// TestPodErrnosReadInBothLibcs: each errno a pod's file operation can meet is read back from
// its text in glibc's words (a distribution's tools, and a command session's write) and in
// musl's (an Alpine image's), and every errno that has a class of the package's (pathClasses)
// is one of them: an errno a pod's tools say that no row reads is told as a fault of the
// worker's side.
func TestPodErrnosReadInBothLibcs(t *testing.T) {
	t.Parallel()
	for _, e := range podErrnos {
		glibc := e.errno.Error()
		glibc = strings.ToUpper(glibc[:1]) + glibc[1:]
		for _, text := range []string{glibc, e.musl} {
			if got, ok := podErrno(text); !ok || got != e.errno {
				t.Errorf("%q read as %v, %v; want %v", text, got, ok, e.errno)
			}
		}
	}
	for _, c := range pathClasses {
		for _, err := range c.errs {
			var errno syscall.Errno
			if !errors.As(err, &errno) {
				continue
			}
			if _, ok := podErrno(errno.Error()); !ok {
				t.Errorf("%v has a class (%v) but no row in podErrnos", errno, c.class)
			}
		}
	}
	if _, ok := podErrno("Something else"); ok {
		t.Error("a text of no errno was read as one")
	}
}
