package workercmd

import (
	"context"
	"io"
	"time"

	"github.com/boxcar-run/boxcar/internal/connflags"
)

// SetupWithin is `worker setup --config path` waiting at most budget for NATS's answers, with
// the identity getenv's NATS_* variables give.
func SetupWithin(ctx context.Context, budget time.Duration, path string, getenv func(string) string, stdout, stderr io.Writer) error {
	return runSetup(ctx, budget, path, connflags.NATS{}, getenv, stdout, stderr)
}
