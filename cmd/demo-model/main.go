// Command demo-model serves the scripted OpenAI-compatible chat endpoint of internal/demomodel
// for `make demo`, where no model can be reached:
//
//	demo-model --addr 127.0.0.1:0 [--addr-file PATH]
//
// It prints the base URL to give the worker ("http://127.0.0.1:PORT/v1") on stdout and, with
// --addr-file, writes it to that file (atomically; removed again on exit). It stops on SIGINT
// or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/boxcar-run/boxcar/internal/demomodel"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "demo-model:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo-model", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:0", "listen address; port 0 picks a free port")
	addrFile := fs.String("addr-file", "", "also write the base URL to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	ln, err := new(net.ListenConfig).Listen(ctx, "tcp", *addr)
	if err != nil {
		return err
	}
	baseURL := "http://" + ln.Addr().String() + "/v1"
	srv := &http.Server{Handler: demomodel.Handler(), ReadHeaderTimeout: 10 * time.Second}

	if *addrFile != "" {
		if err := writeAtomic(*addrFile, baseURL+"\n"); err != nil {
			ln.Close()
			return err
		}
		defer os.Remove(*addrFile)
	}
	fmt.Fprintln(stdout, baseURL)
	fmt.Fprintf(stderr, "demo-model: scripted chat completions (not an LLM) at %s\n", baseURL)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		return srv.Shutdown(shutdownCtx)
	})
	return g.Wait()
}

// writeAtomic writes data to a temporary file next to name and renames it into place, so a
// reader never sees a partial URL.
func writeAtomic(name, data string) error {
	f, err := os.CreateTemp(filepath.Dir(name), filepath.Base(name)+".tmp*")
	if err != nil {
		return err
	}
	if _, err := f.WriteString(data); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), name); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}
