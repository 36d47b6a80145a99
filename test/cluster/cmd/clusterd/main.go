// Command clusterd runs the test cluster for as long as its standard input stays open. It
// prints one JSON line (Ready) when the cluster is up, and tears the cluster down when stdin
// reaches EOF: the test binary that started it closed it, or died. This is what makes
// teardown happen after a panic or a test timeout, which no deferred call in the test binary
// survives.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/boxcar-run/boxcar/test/cluster"
)

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "clusterd:", err)
		os.Exit(1)
	}
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("clusterd", flag.ContinueOnError)
	var cfg cluster.Config
	fs.StringVar(&cfg.StateDir, "state", "", "state folder, created and removed")
	fs.StringVar(&cfg.HelperDir, "helpers", "", "folder with the boxcar-cni and pause binaries")
	fs.StringVar(&cfg.BinDir, "bin", "", "folder with the Kubernetes binaries (default: the build.sh cache)")
	fs.StringVar(&cfg.LogDir, "logs", "", "folder for the components' logs (default: in the state folder)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Logger = slog.New(slog.NewJSONHandler(stderr, nil))
	lock, err := cluster.Lock()
	if err != nil {
		return err
	}
	defer lock.Close()
	cluster.CleanupStale(cfg.Logger)

	// Interrupts reach the test binary; clusterd waits for its stdin to close instead.
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	closed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		close(closed)
	}()
	go func() {
		select {
		case <-closed:
			stop() // EOF during bring-up: stop bringing up
		case <-ctx.Done():
		}
	}()
	c, err := cluster.Start(ctx, cfg)
	if err != nil {
		return err
	}
	ready, _ := json.Marshal(cluster.Ready{Kubeconfig: c.Kubeconfig, APIServer: c.APIServer, Containerd: c.Containerd(), Timings: c.Timings})
	fmt.Fprintf(stdout, "%s\n", ready)
	select {
	case <-closed:
	case <-ctx.Done():
	}
	tctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return c.Stop(tctx)
}
