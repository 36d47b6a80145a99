package submitcmd

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// asSubmit, in the environment, makes the test binary run as the submit command (as
// cmd/submit does: signals, Run, the exit code) with the JSON array of arguments it holds, so
// that a test can run submit on a terminal of its own without building anything.
const asSubmit = "BOXCAR_SUBMITCMD_TEST_AS_SUBMIT"

func TestMain(m *testing.M) {
	if raw := os.Getenv(asSubmit); raw != "" {
		var args []string
		if err := json.Unmarshal([]byte(raw), &args); err != nil {
			fmt.Fprintln(os.Stderr, "bad", asSubmit, err)
			os.Exit(2)
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		err := Run(ctx, args, os.Getenv, os.Stdout, os.Stderr)
		stop()
		code, msg := ExitCode(err)
		if msg != "" {
			fmt.Fprintln(os.Stderr, "submit:", msg)
		}
		os.Exit(code)
	}
	os.Exit(m.Run())
}
