package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"
)

// Ready reports whether the worker can take jobs; nil means ready.
type Ready func(ctx context.Context) error

// Check is one condition of readiness, such as "connected to NATS".
type Check struct {
	// Name says what is checked, in a few words; it prefixes the error /readyz shows.
	Name string
	// Func returns nil when the condition holds. It must return within the ctx it is given.
	Func func(ctx context.Context) error
}

// AllReady is ready when every check passes. It runs them in order and stops at the first
// that fails, so cheap local checks (draining) should come before remote ones (the store).
func AllReady(checks ...Check) Ready {
	return func(ctx context.Context) error {
		for _, c := range checks {
			if err := c.Func(ctx); err != nil {
				return fmt.Errorf("%s: %w", c.Name, err)
			}
		}
		return nil
	}
}

// readyTimeout bounds one /readyz answer; kubelet probes time out after a second by default,
// the chart gives them more.
const readyTimeout = 3 * time.Second

func readyHandler(ready Ready, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ready == nil {
			fmt.Fprintln(w, "ready")
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		if err := ready(ctx); err != nil {
			if log != nil {
				log.DebugContext(ctx, "not ready", "error", err)
			}
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
}
