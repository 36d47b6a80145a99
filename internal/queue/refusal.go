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
// under one of prefixes: a refused publish or request gets no answer, only an error on the connection,
// so waiting for the answer would wait out the caller's timeout and look like an outage.
func unlessRefused(ctx context.Context, nc *nats.Conn, prefixes []string, op func(context.Context) error) error {
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
			if err := nc.LastError(); err != before && refusedUnder(err, prefixes) { //nolint:errorlint // identity, not kind
				cancel()
				<-done
				return fmt.Errorf("%w: %v; this login may not use it: log in as an identity of the tenant and role that may (--nats-creds, --tenant)", ErrRefused, err)
			}
		}
	}
}

// refusedUnder reports a permissions violation for a subject under one of prefixes.
func refusedUnder(err error, prefixes []string) bool {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return false
	}
	for _, p := range prefixes {
		if strings.Contains(err.Error(), `"`+p) {
			return true
		}
	}
	return false
}
