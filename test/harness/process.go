package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/boxcar-run/boxcar/internal/spawn"
)

// Addrs are a ready worker's addresses, as its --ready-file holds them (workercmd.Addrs).
type Addrs struct {
	NATS    string `json:"nats"`
	Metrics string `json:"metrics,omitempty"`
	Store   string `json:"store"`
}

// Process is a program the tests run as a child process, and start again after a kill as an
// operator restarts one: a worker (bin/worker, or a test binary that runs workercmd), a
// nats-server, versitygw. Set the fields, then Start. A worker's readiness is its ready file:
// with ReadyFile set, Start passes --ready-file and WaitReady waits for the file.
type Process struct {
	Name string   // for errors: "worker 1"
	Path string   // the program
	Args []string // its arguments
	Env  []string // KEY=value pairs after the process's environment
	Log  string   // file that gets stdout and stderr, appended to across starts
	// ReadyFile is passed as --ready-file: the worker writes its addresses there once it takes
	// jobs and removes it when it stops. Empty: not a worker, no flag.
	ReadyFile string

	cmd  *exec.Cmd
	done chan struct{}
	err  error // how the last run ended, set before done closes
}

// Start starts the program; the one before must have ended. It is killed when ctx ends, and
// dies with the process that started it (spawn.Start), so nothing outlives an interrupted run.
func (p *Process) Start(ctx context.Context) error {
	f, err := os.OpenFile(p.Log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("%s: log: %w", p.Name, err)
	}
	args := p.Args
	if p.ReadyFile != "" {
		_ = os.Remove(p.ReadyFile) // a killed worker leaves its file behind
		args = append(args[:len(args):len(args)], "--ready-file", p.ReadyFile)
	}
	cmd := exec.CommandContext(ctx, p.Path, args...)
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := spawn.Start(cmd); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func(done chan struct{}) {
		p.err = cmd.Wait()
		f.Close()
		close(done)
	}(p.done)
	return nil
}

// WaitReady waits up to timeout (times Scale) for the worker's ready file and returns the
// addresses in it; it fails at once when the process exits first.
func (p *Process) WaitReady(ctx context.Context, timeout time.Duration) (Addrs, error) {
	return WaitReadyFile(ctx, timeout, p.Name, p.ReadyFile, p.Exited)
}

// WaitReadyFile waits up to timeout (times Scale) for the --ready-file at path of the worker
// called name, and returns the addresses in it; it fails at once when alive returns an error
// (the worker, a process or a container, has stopped).
func WaitReadyFile(ctx context.Context, timeout time.Duration, name, path string, alive func() error) (Addrs, error) {
	var a Addrs
	err := Poll(ctx, timeout, name+" to be ready", func(context.Context) (bool, error) {
		data, err := os.ReadFile(path)
		if err == nil {
			if err := json.Unmarshal(data, &a); err != nil {
				return false, fmt.Errorf("%w: ready file %s: %w", ErrStop, path, err)
			}
			return true, nil
		}
		if xerr := alive(); xerr != nil {
			return false, fmt.Errorf("%w: %w", ErrStop, xerr)
		}
		return false, err
	})
	return a, err
}

// Exited is an error naming how the process ended, once it has; nil while it runs.
func (p *Process) Exited() error {
	if p.cmd == nil {
		return fmt.Errorf("%s was never started", p.Name)
	}
	select {
	case <-p.done:
		return fmt.Errorf("%s exited: %v (log %s)", p.Name, p.err, p.Log)
	default:
		return nil
	}
}

// Done closes once the process of the last Start has ended.
func (p *Process) Done() <-chan struct{} { return p.done }

// Pid is the process id of the last Start.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Signal sends s to the process, if it was started.
func (p *Process) Signal(s syscall.Signal) {
	if p != nil && p.cmd != nil {
		_ = p.cmd.Process.Signal(s)
	}
}

// Kill is kill -9; it returns once the process has ended.
func (p *Process) Kill() {
	if p == nil || p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// ErrKilled says a process did not end within its grace after SIGTERM and was killed.
var ErrKilled = errors.New("killed after the grace period")

// Stop asks the process to end (SIGCONT, in case it was stopped, then SIGTERM) and waits for
// it, killing it after grace; it returns ErrKilled then.
func (p *Process) Stop(grace time.Duration) error {
	if p == nil || p.cmd == nil {
		return nil
	}
	p.Signal(syscall.SIGCONT)
	p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
		p.Kill()
		return fmt.Errorf("%s: %w", p.Name, ErrKilled)
	}
}
