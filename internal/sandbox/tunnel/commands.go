package tunnel

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
)

// CommandsArg runs the pod's side of a command session: `BINARY CommandsArg`. A warm pod
// opens one while it waits for its job, so that the job's commands and file transfers each
// cost a stream of that session instead of a pods/exec of their own (an API server request,
// a kubelet stream and a runtime exec, ~100-300 ms each). The pod's side runs each argv as
// the runtime's exec would: in the container, as its user, with its environment and folder,
// stdin from the worker, stdout and stderr apart, and the exit code back. What the command may
// do is the container's, unchanged: the session adds no power.
const CommandsArg = "__boxcar-exec-session"

// commandsReady is the line the pod's side writes before its yamux session starts.
const commandsReady = "boxcar-exec-session ready\n"

// Frames from the pod's side: kind, a big-endian uint32 length, then that many bytes.
const (
	frameStdout byte = 1
	frameStderr byte = 2
	frameExit   byte = 3 // a big-endian int32 exit code
	frameFailed byte = 4 // the command could not start: why
	// maxFrame bounds what one frame may make the worker hold: the pod's side is the
	// sandbox's.
	maxFrame = 32 << 10
	// maxHeader bounds a command's argv as the pod's side reads it.
	maxHeader = 8 << 20
)

// ErrSessionDown is a command the session could not send: the pod never saw it, so the caller
// may run it another way.
var ErrSessionDown = errors.New("command session: down")

// errNotStarted is a command the pod's side refused before starting it (frameFailed).
var errNotStarted = errors.New("command session: the command did not start")

// header is what the worker sends first on a command's stream, as one JSON line; stdin follows.
type header struct {
	Argv []string `json:"argv"`
	Mark string   `json:"mark,omitempty"`
	File *File    `json:"file,omitempty"`
	Exec *Exec    `json:"exec,omitempty"`
	// Egress asks the pod's side to listen for the sandbox's egress (egress.go); it has no
	// argv, so a pod's side that does not know it refuses it as "no argv".
	Egress bool `json:"egress,omitempty"`
}

// Command is one command of a session.
type Command struct {
	Argv []string
	// Mark, an environment entry (NAME=VALUE) that every process of the command carries unless
	// it sheds it, has the pod's side kill the command's tree once the command has ended (what
	// carries the mark, and in a pod what the command orphaned: commandSet.kill), before it
	// reports the exit code. A command's own kill runs a program to find its processes, and a
	// fork bomb that fills the pod's process bound leaves it none to run; the session kills
	// without starting a process.
	Mark string
	// File, when set, is done by the pod's side itself instead of Argv (files.go); Argv,
	// the same operation as a script, is what a pod's side that does not know it runs.
	File *File
	// Exec, when set, is started by the pod's side itself instead of Argv (run.go), as File.
	Exec           *Exec
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

func runCommands() int {
	spareThreads(8)
	// The pod's process is the session's alone: what its commands orphan comes to it.
	reaper := true
	if err := becomeReaper(); err != nil {
		reaper = false
		fmt.Fprintf(os.Stderr, "command session: %v; a command's orphans that shed its mark may be left running\n", err)
	}
	if err := serveCommands(os.Stdin, os.Stdout, listenEgress, newCommandSet(reaper)); err != nil {
		fmt.Fprintf(os.Stderr, "command session: %v\n", err)
		return 1
	}
	return 0
}

// ServeCommands is the pod's side: it says ready on out, then runs the command of each stream
// the worker opens on a yamux session over in and out, until the session ends. The commands
// still running then are killed (the worker closes the session as it deletes the pod), and
// ServeCommands returns once they have ended. An egress request listens with egress (in the
// pod: bridge.ListenAddr; nil refuses the request as a pod's side that predates it does) and
// carries each connection as a stream it opens toward the worker.
//
// A process that serves in-process (a test's) is no child subreaper and has children of its
// own: a command's tree is then what carries its mark and what is beneath the command, and
// nothing is taken for an orphan.
func ServeCommands(in io.Reader, out io.Writer, egress func() (net.Listener, error)) error {
	return serveCommands(in, out, egress, newCommandSet(false))
}

func serveCommands(in io.Reader, out io.Writer, egress func() (net.Listener, error), set *commandSet) error {
	sess, err := clientSession(in, out, commandsReady)
	if err != nil {
		return err
	}
	var running sync.WaitGroup
	defer running.Wait()
	defer sess.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-sess.CloseChan()
		cancel()
	}()
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			if sess.IsClosed() {
				return nil
			}
			return err
		}
		running.Go(func() {
			serveCommand(ctx, set, st, func(fw *frameWriter) { serveEgress(st, fw, sess, egress) })
		})
	}
}

// serveCommand runs one stream's command to its end, or until ctx ends (the session did), and
// sends its output and exit code; an egress request it hands to egress.
func serveCommand(ctx context.Context, set *commandSet, st *yamux.Stream, egress func(*frameWriter)) {
	defer st.Close()
	br := bufio.NewReader(io.LimitReader(st, maxHeader))
	h, err := readHeader(br)
	fw := &frameWriter{w: st}
	if err != nil {
		_ = fw.frame(frameFailed, []byte("read the command: "+err.Error()))
		return
	}
	switch {
	case h.Egress:
		egress(fw)
		return
	case h.File != nil:
		serveFile(h.File, io.MultiReader(br, st), fw)
		return
	case h.Exec != nil:
		serveExec(ctx, set, h.Exec, h.Mark, io.MultiReader(br, st), fw)
		return
	}
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		_ = fw.frame(frameFailed, []byte(err.Error()))
		return
	}
	cmd := exec.CommandContext(ctx, h.Argv[0], h.Argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdinR, fw.kind(frameStdout), fw.kind(frameStderr)
	// A child left holding the output (the backend's scripts kill theirs) does not hold the
	// command's end for long.
	cmd.WaitDelay = time.Second
	err = set.start(cmd, h.Mark)
	stdinR.Close()
	if err != nil {
		stdinW.Close()
		_ = fw.frame(frameFailed, []byte(err.Error()))
		return
	}
	// What is left of the header's reader, then the rest of the stream, is the command's stdin.
	go func() {
		_, _ = io.Copy(stdinW, io.MultiReader(br, st))
		stdinW.Close()
	}()
	code := 0
	if err := cmd.Wait(); err != nil {
		code = exitCode(err)
	}
	set.done(cmd.Process.Pid)
	if h.Mark != "" {
		set.kill(h.Mark, 0)
	}
	sendExit(fw, code)
}

// readHeader reads a stream's header line from br (bounded by maxHeader) and checks it.
func readHeader(br *bufio.Reader) (header, error) {
	var h header
	line, err := br.ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &h)
	}
	if err == nil && len(h.Argv) == 0 && !h.Egress {
		err = errors.New("no argv")
	}
	if err == nil && h.Mark != "" && strings.Index(h.Mark, "=") < 1 {
		err = fmt.Errorf("mark %q is not NAME=VALUE", h.Mark)
	}
	return h, err
}

// sendExit sends the command's last frame, its exit code.
func sendExit(fw *frameWriter, code int) {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(int32(code)))
	_ = fw.frame(frameExit, b[:])
}

// exitCode is a finished command's code as a runtime's exec reports it: 128 plus the signal
// for one killed by a signal.
func exitCode(err error) int {
	if errors.Is(err, exec.ErrWaitDelay) {
		return 0 // it exited 0; a child it left held its output past WaitDelay
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return 126
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ee.ExitCode()
}

// frameWriter writes whole frames, one at a time, however many writers share it.
type frameWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (f *frameWriter) frame(kind byte, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for first := true; first || len(p) > 0; first = false {
		n := min(len(p), maxFrame)
		buf := make([]byte, 5+n)
		buf[0] = kind
		binary.BigEndian.PutUint32(buf[1:5], uint32(n))
		copy(buf[5:], p[:n])
		if _, err := f.w.Write(buf); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

func (f *frameWriter) kind(k byte) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		if err := f.frame(k, p); err != nil {
			return 0, err
		}
		return len(p), nil
	})
}

type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }

// Commands is the worker's side of a command session.
type Commands struct {
	sess *yamux.Session

	// The streams the pod's side opens are egress connections (egress.go): acceptEgress takes
	// each and hands it to the open listener, or closes it when none is open.
	egressMu   sync.Mutex
	egressTo   *sessionListener
	acceptOnce sync.Once
}

// DialCommands is the worker's side over the exec's streams: r is the pod side's stdout, w
// its stdin. It waits for the pod's side to say it is ready (until ctx ends). Closing the
// session ends the pod's side (its stdin closes).
func DialCommands(ctx context.Context, r io.Reader, w io.WriteCloser) (*Commands, error) {
	sess, err := serverSession(ctx, r, w, commandsReady)
	if err != nil {
		return nil, err
	}
	return &Commands{sess: sess}, nil
}

// Ping waits for the pod's side to answer a ping (no stream, no process): an answer means the
// session, and so the container it runs in, is up.
func (c *Commands) Ping(ctx context.Context) error {
	pong := make(chan error, 1)
	go func() {
		_, err := c.sess.Ping()
		pong <- err
	}()
	select {
	case err := <-pong:
		return err
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Close ends the session.
func (c *Commands) Close() error { return c.sess.Close() }

// Done closes when the session has ended.
func (c *Commands) Done() <-chan struct{} { return c.sess.CloseChan() }

// Run runs cmd in the pod with its stdin, writing its stdout and stderr, and returns its exit
// code. ErrSessionDown means the command was not sent. Like an exec's stream, ending ctx
// stops waiting for the command, not the command.
func (c *Commands) Run(ctx context.Context, cmd Command) (int, error) {
	st, err := c.open(header{Argv: cmd.Argv, Mark: cmd.Mark, File: cmd.File, Exec: cmd.Exec})
	if err != nil {
		return -1, err
	}
	defer st.Close()
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		if cmd.Stdin != nil {
			_, _ = io.Copy(st, cmd.Stdin)
		}
		_ = st.Close() // a half close: the command's stdin ends, its output still comes back
	}()
	defer func() {
		_ = st.SetWriteDeadline(time.Now()) // a command that ended reads no more stdin
		<-fed
	}()
	return await(ctx, st, cmd.Stdout, cmd.Stderr)
}

// open opens a stream and sends h on it. ErrSessionDown means the pod's side never saw h.
func (c *Commands) open(h header) (*yamux.Stream, error) {
	line, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	st, err := c.sess.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSessionDown, err)
	}
	if _, err := st.Write(append(line, '\n')); err != nil {
		st.Close()
		return nil, fmt.Errorf("%w: %w", ErrSessionDown, err)
	}
	return st, nil
}

// await reads st's frames until the exit code, or until ctx ends. The frames are read apart,
// so that a caller's writer that no longer drains (an Open nobody reads) cannot hold it past
// ctx; the reader ends once that writer fails.
func await(ctx context.Context, st *yamux.Stream, stdout, stderr io.Writer) (int, error) {
	type result struct {
		code int
		err  error
	}
	read := make(chan result, 1)
	go func() {
		code, err := readFrames(st, stdout, stderr)
		read <- result{code, err}
	}()
	select {
	case r := <-read:
		return r.code, r.err
	case <-ctx.Done():
		_ = st.SetReadDeadline(time.Now())
		return -1, context.Cause(ctx)
	}
}

// readFrames reads the pod side's frames until the exit code.
func readFrames(r io.Reader, stdout, stderr io.Writer) (int, error) {
	var hdr [5]byte
	buf := make([]byte, maxFrame)
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return -1, fmt.Errorf("command session: the stream ended before the exit code: %w", err)
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		if n > maxFrame {
			return -1, fmt.Errorf("command session: a frame of %d bytes, more than %d", n, maxFrame)
		}
		p := buf[:n]
		if _, err := io.ReadFull(r, p); err != nil {
			return -1, fmt.Errorf("command session: the stream ended before the exit code: %w", err)
		}
		switch hdr[0] {
		case frameStdout:
			_, _ = stdout.Write(p)
		case frameStderr:
			_, _ = stderr.Write(p)
		case frameExit:
			if n != 4 {
				return -1, fmt.Errorf("command session: an exit frame of %d bytes", n)
			}
			return int(int32(binary.BigEndian.Uint32(p))), nil
		case frameFailed:
			return -1, fmt.Errorf("%w: %s", errNotStarted, p)
		default:
			return -1, fmt.Errorf("command session: a frame of unknown kind %d", hdr[0])
		}
	}
}

// spareThreads has the Go runtime make n threads now and keep them idle. The session runs in
// the sandbox's pod, whose processes and threads the kubelet bounds (podPidsLimit): a command
// that fills the bound (a fork bomb) would leave the runtime unable to make the thread it
// needs to wait for that command, and it aborts when it cannot. Threads made now are reused.
func spareThreads(n int) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			// A blocking syscall holds its thread, so the runtime makes another for the rest.
			_ = syscall.Nanosleep(&syscall.Timespec{Nsec: 20_000_000}, nil)
		})
	}
	wg.Wait()
}
