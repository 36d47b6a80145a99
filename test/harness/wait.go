package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// DefaultTimeout is how long Wait waits unless told otherwise, before Scale.
const DefaultTimeout = time.Minute

// ScaleEnv names the variable that multiplies every timeout of Wait and Poll (a number, such as
// 2.5); without it, the timeouts double when CI is set and grow with the load average beyond
// the machine's cores, up to four times.
const ScaleEnv = "BOXCAR_TEST_TIMEOUT_SCALE"

const maxLoadScale = 4

// Scale is the factor every timeout is multiplied by, worked out once per process.
var Scale = sync.OnceValue(func() float64 {
	if v, err := strconv.ParseFloat(os.Getenv(ScaleEnv), 64); err == nil && v > 0 {
		return v
	}
	scale := 1.0
	if os.Getenv("CI") != "" {
		scale = 2
	}
	return max(scale, loadScale())
})

// loadScale is the 1-minute load average per core, between 1 and maxLoadScale.
func loadScale() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 1
	}
	load, err := strconv.ParseFloat(strings.Fields(string(data) + " 0")[0], 64)
	if err != nil {
		return 1
	}
	return min(max(load/float64(runtime.NumCPU()), 1), maxLoadScale)
}

// Timeout is d multiplied by Scale.
func Timeout(d time.Duration) time.Duration { return time.Duration(float64(d) * Scale()) }

// ErrStop ends a wait at once: a condition returns an error wrapping it when what it waits
// for can no longer happen (the process it waits on exited).
var ErrStop = errors.New("stop waiting")

// Poll calls cond until it returns true, and returns nil then. It fails once timeout (times
// Scale; 0: none) has passed or ctx ends, with an error naming what it waited for and the last
// error cond returned, and at once when cond returns an error wrapping ErrStop. The pause
// between calls grows from 10 ms to 200 ms.
func Poll(ctx context.Context, timeout time.Duration, what string, cond func(context.Context) (bool, error)) error {
	cancel := func() {}
	if timeout > 0 {
		timeout = Timeout(timeout)
		ctx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	pause := 10 * time.Millisecond
	var last error
	for {
		ok, err := cond(ctx)
		switch {
		case ok:
			return nil
		case errors.Is(err, ErrStop):
			return fmt.Errorf("%s: %w", what, err)
		case err != nil:
			last = err
		}
		select {
		case <-ctx.Done():
			if last == nil {
				last = errors.New("none")
			}
			return fmt.Errorf("%s: %w after %s; last: %v", what, ctx.Err(), timeout, last)
		case <-time.After(pause):
		}
		pause = min(2*pause, 200*time.Millisecond)
	}
}

// WaitOption changes one wait.
type WaitOption func(*time.Duration)

// Within waits up to d (times Scale) instead of DefaultTimeout.
func Within(d time.Duration) WaitOption { return func(t *time.Duration) { *t = d } }

// Wait is Poll for a test: it polls cond until it returns true, and fails the test with what it
// waited for and the last error cond returned once the timeout passes (DefaultTimeout, or
// Within's, times Scale) or the test ends. cond runs on the test's goroutine, so it may fail
// the test itself. Every wait in the tests goes through it; timeouts are generous, because a
// busy machine is slow, and nothing asserts how long a wait took.
func Wait(t testing.TB, what string, cond func() (bool, error), opts ...WaitOption) {
	t.Helper()
	timeout := DefaultTimeout
	for _, o := range opts {
		o(&timeout)
	}
	if err := Poll(t.Context(), timeout, what, func(context.Context) (bool, error) { return cond() }); err != nil {
		t.Fatal(err)
	}
}
