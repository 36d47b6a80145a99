// Command worker takes Boxcar jobs from NATS JetStream and runs each in a sandbox with an agent
// loop. `worker --embedded` runs everything on one machine: NATS in-process, a file store and
// bubblewrap sandboxes.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/boxcar-run/boxcar/internal/cli"
	"github.com/boxcar-run/boxcar/internal/workercmd"
)

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sigs
		fmt.Fprintln(os.Stderr, "worker: stopping: finishing running jobs (signal again to stop at once)")
		cancel()
		<-sigs
		fmt.Fprintln(os.Stderr, "worker: second signal: stopping at once")
		os.Exit(130)
	}()
	code, msg := cli.ExitCode(workercmd.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
	cli.PrintError(os.Stderr, "worker", msg)
	os.Exit(code)
}
