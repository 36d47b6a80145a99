package sandbox

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/boxcar-run/boxcar/internal/sandbox/tunnel"
)

// killGrace is how long a command's stream may outlive its timeout before the worker gives it
// up, and how long a kill from outside may take.
const killGrace = 10 * time.Second

// The scripts that run inside the pod, in podscripts/ so that shellcheck sees them (make lint).
// Each is sent as the argument of sh -c on every call, so the image needs sh and the usual
// busybox or coreutils tools, and nothing of Boxcar's.
var (
	//go:embed podscripts/pause.sh
	pauseScript string
	//go:embed podscripts/killfunc.sh
	killFunc string
	//go:embed podscripts/exec.sh
	execBody string
	//go:embed podscripts/kill.sh
	killBody string
	//go:embed podscripts/file.sh
	fileScript string
)

// execScript runs a command inside the pod with what pods/exec lacks: an environment of the
// caller's choosing (env -i: nothing of the container's), a folder, stdin kept for the
// background job, and a timeout that kills the whole tree. Every process of the command
// carries BOXCAR_EXEC=<nonce> in its environment unless it sheds it, and the rest of the tree
// is found by parentage (killFunc); process groups are not reliable in a container without
// job control. When the command ends, what it left running is killed too, as in the
// bubblewrap backend.
//
// Arguments: timeout in seconds (0: none), nonce, folder, then NAME=VALUE... and argv.
//
// killFunc (k NONCE) kills every process whose environment holds BOXCAR_EXEC=NONCE, what the
// command orphaned to the pod's pid 1, and everything beneath either, until none is left. grep reads each environment as NUL-separated records (-z, which GNU, busybox and
// toybox grep have): busybox grep without it stops reading a line at the first NUL, and so
// would find the variable only where it comes first, while a shell re-orders the environment
// of what it executes. The processes found are all stopped, then all killed: killed one by
// one, a parent could act on the death of its child (sleep 1; echo late) before its own turn
// came.
//
// killScript kills a command's tree from outside, when its stream could not be ended in time.
//
// fileScript moves files through exec, confined to the workdir: every path is resolved inside
// the pod (symlinks included) and refused unless it stays beneath the workdir; no folder is made
// before the deepest existing one on the way is known to be inside, and a symlink where a file
// is written is replaced, not written through (mv would move the file into a folder it names).
// It reports failures as "boxcar-<nonce>: <reason>" on stderr with exit code 125. Arguments:
// operation (read, open, write, list), nonce, workdir, workdir-relative path, [max bytes]. open
// is read that takes no symlink on the path at all (Open); both check everything before cat
// writes the first byte.
var (
	execScript = killFunc + execBody
	killScript = killFunc + killBody
)

// runExec executes a script in the pod through pods/exec and returns its exit code.
func (s *kubernetesSandbox) runExec(ctx context.Context, argv []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	err := s.p.exec.Exec(ctx, s.p.cfg.Namespace, s.name, argv, stdin, stdout, stderr)
	var exit utilexec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exit) && exit.Exited():
		return exit.ExitStatus(), nil
	}
	return -1, err
}

// Exec runs argv in the pod through the exec wrapper.
func (s *kubernetesSandbox) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	dir, maxOut, err := checkExec(req)
	if err != nil {
		return ExecResult{}, err
	}
	name := req.Argv[0]
	if strings.Contains(name, "=") {
		// env would take it for a variable.
		return ExecResult{}, fmt.Errorf("sandbox: exec %s: a program name must not contain '='", name)
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	id, err := s.begin(cancel)
	if err != nil {
		return ExecResult{}, fmt.Errorf("sandbox: exec %s: %w", name, err)
	}
	defer s.end(id)

	nonce := randomHex(8)
	env := map[string]string{"PATH": defaultPATH, "HOME": s.workdir, "LANG": "C.UTF-8"}
	maps.Copy(env, req.Env)
	argv := []string{"sh", "-c", execScript, "boxcar-exec", seconds(req.Timeout), nonce, path.Join(s.workdir, dir)}
	vars := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		vars = append(vars, k+"="+env[k])
	}
	argv = append(append(argv, vars...), req.Argv...)
	// A command session starts it itself, as the script would; pods/exec runs the script.
	native := &tunnel.Exec{Argv: req.Argv, Dir: path.Join(s.workdir, dir), Env: vars, Timeout: req.Timeout, Nonce: nonce}

	streamCtx := runCtx
	var outside *outsideKill
	if req.Timeout > 0 {
		var stop context.CancelFunc
		streamCtx, stop = context.WithTimeoutCause(runCtx, req.Timeout+killGrace, errExecTimeout)
		defer stop()
		outside = s.killAfter(ctx, req.Timeout+outsideKillDelay, nonce)
	}
	stdout := &cappedBuffer{max: maxOut}
	stderr := &cappedBuffer{max: maxOut}
	// Always a stdin, empty when none is given: the wrapper hands it on to the command.
	stdin := bytes.NewReader(req.Stdin)
	start := time.Now()
	code, err := s.run(streamCtx, tunnel.Command{Argv: argv, Mark: execMark + "=" + nonce, Exec: native, Stdin: stdin, Stdout: stdout, Stderr: stderr})
	killed := outside.stop()
	res := ExecResult{ExitCode: code, Duration: time.Since(start)}
	res.Stdout, res.StdoutTruncated = stdout.take()
	res.Stderr, res.StderrTruncated = stderr.take()
	if streamCtx.Err() != nil {
		// Closing the stream does not stop the command: kill its tree inside the pod, unless
		// the outside kill has just spent its grace on it.
		if !killed {
			s.kill(ctx, nonce)
		}
		switch cause := context.Cause(streamCtx); {
		case errors.Is(cause, errExecTimeout):
			res.ExitCode, res.TimedOut = 137, true
			return res, nil
		default:
			return res, stopError(ctx, name, cause)
		}
	}
	if err != nil {
		return ExecResult{}, s.execFailure(ctx, "exec "+name, err)
	}
	if code == 125 && bytes.HasPrefix(res.Stderr, []byte("boxcar-"+nonce+": notfound")) {
		return ExecResult{}, fmt.Errorf("sandbox: exec %s: dir %s: %w", name, dir, ErrNotFound)
	}
	if req.Timeout > 0 && code == 137 && res.Duration >= req.Timeout {
		res.TimedOut = true
	}
	return res, nil
}

// execFailure explains an exec that ended without an exit code. An answer that the pod or its
// container is gone (podGone) means the sandbox is lost (lostError). A runtime that cannot
// start the program it was asked to exec answers with an internal-error status, not exit code
// 126 or 127 (docs/test-cluster.md, pitfall 8). The backend always execs sh, which starts the
// command itself (a command that is missing is sh's exit code 127, a result), so this means
// the image has no usable sh.
func (s *kubernetesSandbox) execFailure(ctx context.Context, op string, err error) error {
	if gone := podGone(s.name, err); gone != "" {
		return s.lostError(ctx, op, gone)
	}
	if msg := err.Error(); strings.Contains(strings.ToLower(msg), "internal error") && missingShell(msg) {
		return fmt.Errorf("sandbox: %s in pod %s: the container runtime could not start sh, which runs every command and file transfer; use an image with a POSIX sh on its PATH (busybox or a distribution base): %w: %w",
			op, s.name, ErrUnavailable, err)
	}
	return fmt.Errorf("sandbox: %s in pod %s: %w", op, s.name, err)
}

// missingShell recognises the runtimes' words for a program that is not in the image.
func missingShell(msg string) bool {
	msg = strings.ToLower(msg)
	return strings.Contains(msg, "executable file not found") || strings.Contains(msg, "no such file or directory")
}

// seconds formats a timeout for sleep(1), which busybox and coreutils take fractional.
func seconds(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 3, 64)
}

// outsideKillDelay is how long after its timeout a command whose stream has not ended is
// killed from outside, while the stream still waits: the wrapper's own kill at the timeout can
// find no process to run it when a fork bomb fills the pod's process bound, and a kill started
// only when the stream is given up would hold Exec for two kill graces past the timeout.
const outsideKillDelay = 2 * time.Second

// outsideKill is a kill of one command's tree, due at a time unless stopped first.
type outsideKill struct {
	t    *time.Timer
	done chan struct{}
}

func (s *kubernetesSandbox) killAfter(ctx context.Context, d time.Duration, nonce string) *outsideKill {
	k := &outsideKill{done: make(chan struct{})}
	k.t = time.AfterFunc(d, func() {
		defer close(k.done)
		s.kill(ctx, nonce)
	})
	return k
}

// stop cancels the kill if it is not due yet, else waits for it to end, and reports whether
// it ran. A nil kill did not.
func (k *outsideKill) stop() bool {
	if k == nil || k.t.Stop() {
		return false
	}
	<-k.done
	return true
}

// kill runs killScript through pods/exec until it says none of the tree is left (exit 0), for
// up to killGrace: under a fork bomb the script's shell may find no process slot for its grep,
// or the exec no slot for the shell, until a round has stopped enough of the bomb. An answer
// that the pod or its container is gone ends it at once: nothing of the command is left, and
// no round could succeed.
func (s *kubernetesSandbox) kill(ctx context.Context, nonce string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killGrace)
	defer cancel()
	for {
		code, err := s.runExec(ctx, []string{"sh", "-c", killScript, "boxcar-kill", nonce}, nil, io.Discard, io.Discard)
		if err == nil && code == 0 {
			return
		}
		if gone := podGone(s.name, err); gone != "" {
			s.log.Debug("kill a command in the pod: the pod is gone, and the command with it", "pod", s.name, "gone", gone, "error", err)
			return
		}
		select {
		case <-ctx.Done():
			s.log.Warn("kill a command in the pod: processes of it may be left until the pod is deleted", "error", err, "exit_code", code)
			return
		case <-time.After(killRetry):
		}
	}
}

// goneAnswers are the answers to an exec that say the pod or its container no longer runs, so
// that no exec in it can succeed again. The exec client falls back to SPDY after any failed
// WebSocket upgrade, and SPDY keeps only the message of the server's status, so most are
// recognised by their words. Anything else is retried: a runtime that cannot start the kill's
// shell under a fork bomb answers with an internal error whose words differ between runtimes.
var goneAnswers = []struct {
	kind  string
	match func(pod string, err error) bool
}{
	// The API server: the pod was deleted (or evicted and removed).
	{"pod_deleted", func(pod string, err error) bool {
		return apierrors.IsNotFound(err) || strings.Contains(err.Error(), `pods "`+pod+`" not found`)
	}},
	// The kubelet: it runs no such pod any more.
	{"pod_not_on_node", func(_ string, err error) bool { return strings.Contains(err.Error(), "pod does not exist") }},
	// The kubelet finds no running container of that name: it has terminated (the pod's
	// deadline, an eviction, the main process ended).
	{"container_terminated", func(_ string, err error) bool {
		return strings.Contains(err.Error(), fmt.Sprintf("container not found (%q)", containerName))
	}},
	// The runtime: the container exists but has stopped.
	{"container_stopped", func(_ string, err error) bool {
		msg := err.Error()
		return strings.Contains(msg, "CONTAINER_EXITED") || strings.Contains(msg, "cannot exec in a stopped")
	}},
}

// podGone names the kind of answer err is when it says that pod or its container is gone, or
// returns "" when it does not.
func podGone(pod string, err error) string {
	if err == nil {
		return ""
	}
	for _, a := range goneAnswers {
		if a.match(pod, err) {
			return a.kind
		}
	}
	return ""
}

// killRetry is the pause between two rounds of a kill from outside.
const killRetry = 100 * time.Millisecond

// streamExecutor runs commands through the pods/exec subresource: WebSocket
// (v5.channel.k8s.io, which can close stdin) first, SPDY when the server cannot upgrade to it
// (API servers before 1.30, some proxies). Falling back on any other error would run a
// command twice.
type streamExecutor struct {
	rest   rest.Interface // builds the exec URL
	config *rest.Config   // dials it
}

// shouldFallBack allows SPDY only after a failed upgrade: falling back after any other error
// would run a command a second time (docs/test-cluster.md, pitfall 9). The types are k8s.io/streaming's: client-go's
// WebSocket executor returns its UpgradeFailureError, which the deprecated copy in
// k8s.io/apimachinery/pkg/util/httpstream does not match.
func shouldFallBack(err error) bool {
	return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
}

func (e *streamExecutor) Exec(ctx context.Context, namespace, pod string, argv []string, stdin io.Reader, stdout, stderr io.Writer) error {
	req := e.rest.Post().Resource("pods").Namespace(namespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: containerName, Command: argv,
			Stdin: stdin != nil, Stdout: true, Stderr: true,
		}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(e.config, "GET", req.URL().String())
	if err != nil {
		return fmt.Errorf("websocket executor: %w", err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(e.config, "POST", req.URL())
	if err != nil {
		return fmt.Errorf("spdy executor: %w", err)
	}
	exec, err := remotecommand.NewFallbackExecutor(ws, spdy, shouldFallBack)
	if err != nil {
		return err
	}
	return exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Stderr: stderr})
}
