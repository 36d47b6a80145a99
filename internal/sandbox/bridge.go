package sandbox

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"syscall"
)

// The egress bridge is the worker's own binary, run inside a bubblewrap sandbox in front of
// each command once egress is attached. A bubblewrap sandbox keeps no network interface but
// loopback, and each Exec has a network namespace of its own, so something inside that
// namespace must listen on EgressAddr for clients that speak TCP (curl, pip, git). The bridge
// listens there, starts the command as its child with the same stdio and environment, and
// carries each connection to the proxy's unix socket, bind-mounted from the host. It adds no
// power: the socket is visible to the command anyway, and the proxy alone decides.
//
// Running the worker binary again (bound read-only from an open descriptor, so it need not be
// reachable by path from the sandbox's uid) avoids shipping a second program; a goroutine of
// the worker entering each namespace instead would need setns with CAP_SYS_ADMIN there, and
// could only listen after the command had started.
const (
	bridgeArg    = "__boxcar-egress-bridge"
	bridgePath   = "/run/boxcar/bridge"
	egressSocket = egressMount + "/proxy.sock"
)

// RunBridge runs the egress bridge and exits, with the command's status, when this process was
// started as one; otherwise it returns at once. Every binary that starts bubblewrap sandboxes
// with egress calls it first thing in main (and tests in TestMain): the bridge is that binary.
func RunBridge() {
	if len(os.Args) < 3 || os.Args[1] != bridgeArg {
		return
	}
	os.Exit(bridge(os.Args[2:], egressSocket))
}

// bridge listens on EgressAddr, runs argv and returns its exit status as bwrap would report it.
func bridge(argv []string, socket string) int {
	ln, err := net.Listen("tcp", EgressAddr)
	if err != nil {
		// "bwrap: " marks a failure of the sandbox itself (launcherFailure), not of the command.
		fmt.Fprintf(os.Stderr, "bwrap: egress bridge: listen on %s: %v\n", EgressAddr, err)
		return 1
	}
	go serveBridge(ln, socket)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		// Said as bwrap says it, so that launcherFailure turns it into 127 or 126 as without
		// the bridge.
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

func serveBridge(ln net.Listener, socket string) {
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
	up, err := net.Dial("unix", socket)
	if err != nil {
		c.Close() // the proxy is gone or not attached: the client sees the connection close
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
