package sandbox

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/boxcar-run/boxcar/internal/sandbox/bridge"
	"github.com/boxcar-run/boxcar/internal/sandbox/tunnel"
)

// openCommands starts a warm pod's command session (package tunnel, CommandsArg): one exec of
// the bridge's binary, opened while the pod waits for its job, over which the job's commands
// and file transfers then run as streams, each costing a few milliseconds instead of a
// pods/exec of its own. It needs the bridge (BridgeImage). The session runs the same scripts
// with the same arguments as pods/exec would, in the same container, so what a command may do
// and how it is bounded and killed do not change; kills still go through pods/exec, which
// does not depend on anything in the pod.
func (s *kubernetesSandbox) openCommands(ctx context.Context) error {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stdinR, stdinW := io.Pipe()
	stdoutR, stdoutW := io.Pipe()
	stderr := &cappedBuffer{max: 4096}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.p.exec.Exec(sctx, s.p.cfg.Namespace, s.name, []string{bridge.Path, tunnel.CommandsArg}, stdinR, stdoutW, stderr)
		stdoutW.CloseWithError(io.EOF) // the worker's side sees the session end
		stdinR.Close()
	}()
	cmds, err := tunnel.DialCommands(ctx, stdoutR, stdinW)
	if err != nil {
		cancel()
		<-done
		said, _ := stderr.take()
		return errors.Join(err, errors.New(firstLine(said, nil)))
	}
	s.cmds = cmds
	s.stopCmds = sync.OnceFunc(func() {
		_ = cmds.Close()
		cancel()
		<-done
	})
	return nil
}

// run executes a script in the pod, through the command session when the pod has one that is
// up, else through pods/exec, and returns its exit code. A command the session could not send
// goes through pods/exec; one it sent is never sent again. cmd.Mark only counts on the
// session: over pods/exec the command's stream stays open while anything of it still holds
// its output, and Exec kills it from outside.
func (s *kubernetesSandbox) run(ctx context.Context, cmd tunnel.Command) (int, error) {
	if s.cmds != nil {
		code, err := s.cmds.Run(ctx, cmd)
		if !errors.Is(err, tunnel.ErrSessionDown) {
			return code, err
		}
	}
	return s.runExec(ctx, cmd.Argv, cmd.Stdin, cmd.Stdout, cmd.Stderr)
}
