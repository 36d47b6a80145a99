// Command submit hands jobs to Boxcar and follows them: run, status, watch, get.
package main

import (
	"context"
	"errors"
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
	var exit *submitcmd.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		if exit.Msg != "" {
			fmt.Fprintln(os.Stderr, "submit:", exit.Msg)
		}
		os.Exit(exit.Code)
	default:
		fmt.Fprintln(os.Stderr, "submit:", err)
		os.Exit(1)
	}
}
