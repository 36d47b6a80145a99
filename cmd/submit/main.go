// Command submit hands jobs to Boxcar and follows them: run, status, watch, get.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/boxcar-run/boxcar/internal/submitcmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := submitcmd.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	code, msg := submitcmd.ExitCode(err)
	if msg != "" {
		fmt.Fprintln(os.Stderr, "submit:", msg)
	}
	os.Exit(code)
}
