// Package bridge is the egress bridge: the worker's own binary, run again inside a bubblewrap
// sandbox in front of each command once the sandbox has egress. It listens on ListenAddr in
// the command's network namespace (which has no interface but loopback), starts the command as
// its child with the same stdio and environment, carries each connection to the proxy's unix
// socket bind-mounted at Socket, and exits with the command's status. It adds no power: the
// socket is visible to the command anyway, and the proxy alone decides.
//
// It runs from this package's init, before the packages of the rest of the binary are
// initialised: Go initialises packages in import-path order among those whose imports are
// done, and this one imports the standard library alone, so a bridge starts without the cost
// of the worker's heavy dependencies (client-go's and protobuf's registrations), which would
// otherwise be paid by every command. Any binary that links internal/sandbox links this.
package bridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"syscall"
)

// The bridge's command line is Path Arg argv...; ListenAddr and Socket are where it listens
// and where it carries connections, inside the sandbox.
const (
	Arg        = "__boxcar-egress-bridge"
	Path       = "/run/boxcar/bridge"
	ListenAddr = "127.0.0.1:3128"
	Socket     = "/run/boxcar/egress/proxy.sock"
)

func init() {
	if len(os.Args) >= 3 && os.Args[1] == Arg {
		os.Exit(run(os.Args[2:], Socket))
	}
}

// run listens on ListenAddr, runs argv and returns its exit status as bwrap would report it.
func run(argv []string, socket string) int {
	// The bridge lives as long as its command: nothing cancels it but the command's end.
	ctx := context.Background()
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", ListenAddr)
	if err != nil {
		// "bwrap: " marks a failure of the sandbox itself, not of the command (the sandbox
		// package's launcherFailure).
		fmt.Fprintf(os.Stderr, "bwrap: egress bridge: listen on %s: %v\n", ListenAddr, err)
		return 1
	}
	go serve(ln, socket)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		// Said as bwrap says it, so that the command is still "not found" (127) or "not
		// executable" (126) as without the bridge.
		var errno syscall.Errno
		if !errors.As(err, &errno) {
			errno = syscall.ENOENT
		}
		fmt.Fprintf(os.Stderr, "bwrap: execvp %s: %s\n", argv[0], errno.Error())
		return 1
	}
	_ = cmd.Wait()
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return 128 + int(ws.Signal()) // as bwrap reports a command killed by a signal
	}
	return ws.ExitStatus()
}

func serve(ln net.Listener, socket string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go carry(c, socket)
	}
}

// carry copies one connection to the proxy's socket and back. A client's half close is passed
// on, so that a client that ends its request with a shutdown still gets the answer; once the
// proxy has said all it will, both ends close.
func carry(c net.Conn, socket string) {
	var d net.Dialer
	up, err := d.DialContext(context.Background(), "unix", socket)
	if err != nil {
		c.Close() // the proxy is gone: the client sees the connection close
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(up, c)
		_ = up.(*net.UnixConn).CloseWrite()
	}()
	_, _ = io.Copy(c, up)
	c.Close()
	up.Close()
	<-done
}
