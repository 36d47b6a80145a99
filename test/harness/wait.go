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
	return poll(ctx, waitConfig{timeout: timeout}, what, cond)
}

// poll is Poll with a wait's options: a fixed pause between calls when c.every is set.
func poll(ctx context.Context, c waitConfig, what string, cond func(context.Context) (bool, error)) error {
	timeout := c.timeout
	cancel := func() {}
	if timeout > 0 {
		timeout = Timeout(timeout)
		ctx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	pause, most := 10*time.Millisecond, 200*time.Millisecond
	if c.every > 0 {
		pause, most = c.every, c.every
	}
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
		pause = min(2*pause, most)
	}
}

// WaitOption changes one wait.
type WaitOption func(*waitConfig)

// waitConfig is what the options of one wait set.
type waitConfig struct {
	timeout time.Duration // before Scale
	every   time.Duration // the pause between calls; 0: from 10 ms growing to 200 ms
}

// Within waits up to d (times Scale) instead of DefaultTimeout.
func Within(d time.Duration) WaitOption { return func(c *waitConfig) { c.timeout = d } }

// Every checks the condition every d instead of at pauses growing to 200 ms: for a benchmark
// whose figure includes the wait, which then adds at most d to it.
func Every(d time.Duration) WaitOption { return func(c *waitConfig) { c.every = d } }

// Wait is Poll for a test: it polls cond until it returns true, and fails the test with what it
// waited for and the last error cond returned once the timeout passes (DefaultTimeout, or
// Within's, times Scale) or the test ends. cond runs on the test's goroutine, so it may fail
// the test itself. Every wait in the tests goes through it; timeouts are generous, because a
// busy machine is slow, and nothing asserts how long a wait took.
func Wait(t testing.TB, what string, cond func() (bool, error), opts ...WaitOption) {
	t.Helper()
	c := waitConfig{timeout: DefaultTimeout}
	for _, o := range opts {
		o(&c)
	}
	if err := poll(t.Context(), c, what, func(context.Context) (bool, error) { return cond() }); err != nil {
		t.Fatal(err)
	}
}
