package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/boxcar-run/boxcar/internal/spawn"
	"github.com/boxcar-run/boxcar/test/harness"
)

// process is one component the cluster started, with its log file.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// startProcess runs bin with args, its output in logDir/name.log. The process gets its own
// process group (a stop reaches its children) and dies with the supervisor (spawn.Start), so a
// crashed supervisor leaves no control plane behind.
func startProcess(logger *slog.Logger, logDir, name, bin string, args []string, env []string) (*process, error) {
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cluster: %s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := spawn.Start(cmd); err != nil {
		f.Close()
		return nil, fmt.Errorf("cluster: start %s (%s): %w", name, bin, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	logger.Info("cluster: started", "component", name, "pid", cmd.Process.Pid, "log", logPath)
	return p, nil
}

// exited reports an error when the process has ended, with the tail of its log.
func (p *process) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("cluster: %s exited (%v); its log %s ends with:\n%s", p.name, p.err, p.log, tail(p.log, 2000))
	default:
		return nil
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after grace.
func (p *process) stop(grace time.Duration) {
	pgid := -p.cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(pgid, syscall.SIGKILL)
		<-p.done
	}
	// Children that left the group die with it too.
	_ = syscall.Kill(pgid, syscall.SIGKILL)
}

// tail is the last n bytes of a file, for error messages.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err.Error()
	}
	off := max(st.Size()-n, 0)
	buf := make([]byte, st.Size()-off)
	_, _ = f.ReadAt(buf, off)
	return string(buf)
}

// freePorts reserves n distinct free TCP ports on 127.0.0.1 for etcd and kube-apiserver, the
// two parts on the host's loopback that cannot take port 0 (the API server's --secure-port 0
// turns serving off). They are released before the components bind them; a clash with another
// program in between is possible but rare, and shows as a component that exits at start.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("cluster: find a free port on 127.0.0.1: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// waitFor polls cond until it returns true or ctx ends (harness.Poll, the one poll loop of
// the cluster and its tests), and ends the wait at once, with the log, when one of the
// processes has crashed.
func waitFor(ctx context.Context, what string, procs []*process, cond func(ctx context.Context) (bool, error)) error {
	err := harness.Poll(ctx, 0, what, func(ctx context.Context) (bool, error) {
		for _, p := range procs {
			if err := p.exited(); err != nil {
				return false, fmt.Errorf("%w: %w", harness.ErrStop, err)
			}
		}
		return cond(ctx)
	})
	if err != nil {
		return fmt.Errorf("cluster: waiting for %w", err)
	}
	return nil
}

func itoa(i int) string { return strconv.Itoa(i) }

var errMissingTool = errors.New("missing tool")
