package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// ErrRefused marks a request the NATS server refused this login: its permissions do not allow
// the subject. Another try changes nothing.
var ErrRefused = errors.New("refused by the NATS server")

// unlessRefused runs op, and ends it as soon as the server refuses the connection a subject
// of subjects (refusedUnder): a refused publish or request gets no answer, only an error on the connection,
// so waiting for the answer would wait out the caller's timeout and look like an outage.
func unlessRefused(ctx context.Context, nc *nats.Conn, subjects []string, op func(context.Context) error) error {
	before := nc.LastError()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- op(ctx) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			// The same error value is a refusal seen before op began, not a new one.
			if err := nc.LastError(); err != before && refusedUnder(err, subjects) { //nolint:errorlint // identity, not kind
				cancel()
				<-done
				return fmt.Errorf("%w: %v; this login may not use it: log in as an identity of the tenant and role that may (--nats-creds, --tenant)", ErrRefused, err)
			}
		}
	}
}

// refusedUnder reports a permissions violation for one of subjects: a subject itself, or, ending
// in ".>", any subject under its tokens. The violation names its subject whole, and is matched
// whole: a connection's error is the last of any request on it, and a prefix of a subject
// (the stream BOXCAR_JOBS_team of BOXCAR_JOBS_team-b) took another request's refusal as its own.
func refusedUnder(err error, subjects []string) bool {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return false
	}
	// The server's words: Permissions Violation for Publish to "subject" (and, for a
	// subscription, using queue "group" after it).
	_, rest, ok := strings.Cut(err.Error(), `"`)
	refused, _, closed := strings.Cut(rest, `"`)
	if !ok || !closed {
		return false
	}
	for _, s := range subjects {
		under, wild := strings.CutSuffix(s, ">")
		if refused == s || wild && strings.HasSuffix(under, ".") && len(refused) > len(under) && strings.HasPrefix(refused, under) {
			return true
		}
	}
	return false
}
