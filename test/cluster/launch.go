package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Ready is what clusterd prints once the cluster is up.
type Ready struct {
	Kubeconfig string                   `json:"kubeconfig"`
	APIServer  string                   `json:"apiserver"`
	Containerd string                   `json:"containerd"` // the socket of the node's containerd
	Timings    map[string]time.Duration `json:"timings"`
}

// Handle is a cluster that Launch started, seen from the test binary.
type Handle struct {
	Ready
	// RESTConfig and Client are the cluster admin's.
	RESTConfig *rest.Config
	Client     kubernetes.Interface
	// LogDir holds clusterd's and every component's log. Close removes it unless asked to
	// keep it.
	LogDir string

	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan error
}

// Launch starts clusterd and waits until the cluster is up. It needs root (containerd, the
// kubelet and the mounts they make) and the parts build.sh provides, the cluster's own
// programs among them: a test compiles nothing.
func Launch(ctx context.Context, logger *slog.Logger) (*Handle, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("cluster: the test cluster runs containerd and a kubelet and needs root: run `sudo make test-cluster`")
	}
	helpers, err := helperDir()
	if err != nil {
		return nil, err
	}
	h := &Handle{done: make(chan error, 1)}
	if h.LogDir, err = os.MkdirTemp("", "boxcar-cluster-logs-"); err != nil {
		return nil, fmt.Errorf("cluster: log folder: %w", err)
	}
	state := filepath.Join(stateBase(), "run-"+strconv.Itoa(os.Getpid()))
	logf, err := os.Create(filepath.Join(h.LogDir, "clusterd.log"))
	if err != nil {
		return nil, fmt.Errorf("cluster: clusterd log: %w", err)
	}
	defer logf.Close()
	h.cmd = exec.Command(filepath.Join(helpers, "clusterd"), "-state", state, "-helpers", helpers, "-logs", h.LogDir)
	h.cmd.Stderr = logf
	// Its own process group: an interrupt at the terminal reaches the test binary, whose
	// exit then closes clusterd's stdin.
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if h.stdin, err = h.cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("cluster: clusterd stdin: %w", err)
	}
	stdout, err := h.cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("cluster: clusterd stdout: %w", err)
	}
	if err := h.cmd.Start(); err != nil {
		return nil, fmt.Errorf("cluster: start clusterd: %w", err)
	}
	lines := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		if s.Scan() {
			lines <- s.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdout)
		h.done <- h.cmd.Wait()
	}()
	select {
	case line, ok := <-lines:
		if !ok {
			err := <-h.done
			h.done <- err
			return nil, fmt.Errorf("cluster: clusterd failed (%v); logs in %s; clusterd.log ends with:\n%s", err, h.LogDir, tail(logf.Name(), 4000))
		}
		if err := json.Unmarshal([]byte(line), &h.Ready); err != nil {
			h.Close(context.WithoutCancel(ctx), true)
			return nil, fmt.Errorf("cluster: clusterd said %q: %w", line, err)
		}
	case <-ctx.Done():
		h.Close(context.WithoutCancel(ctx), true)
		return nil, fmt.Errorf("cluster: waiting for clusterd: %w; logs in %s", ctx.Err(), h.LogDir)
	}
	if h.RESTConfig, err = clientcmd.BuildConfigFromFlags("", h.Kubeconfig); err != nil {
		return nil, fmt.Errorf("cluster: kubeconfig: %w", err)
	}
	h.RESTConfig.QPS, h.RESTConfig.Burst = 100, 200
	if h.Client, err = kubernetes.NewForConfig(h.RESTConfig); err != nil {
		return nil, fmt.Errorf("cluster: client: %w", err)
	}
	logger.Info("cluster: up", "apiserver", h.APIServer, "logs", h.LogDir)
	return h, nil
}

// Close tears the cluster down and waits for it. The logs stay when keepLogs is set (a test
// failed), and are removed otherwise.
func (h *Handle) Close(ctx context.Context, keepLogs bool) error {
	h.stdin.Close()
	var err error
	select {
	case err = <-h.done:
	case <-ctx.Done():
		err = ctx.Err()
	case <-time.After(3 * time.Minute):
		err = errors.New("clusterd did not finish its teardown within 3m")
	}
	if err != nil {
		err = fmt.Errorf("cluster: teardown: %w; clusterd.log ends with:\n%s", err, tail(filepath.Join(h.LogDir, "clusterd.log"), 4000))
		keepLogs = true
	}
	if !keepLogs {
		os.RemoveAll(h.LogDir)
	}
	return err
}

// RunningContainers lists the ids of the containers whose processes still run on the node
// for pods of a namespace (and of one pod, when pod is not empty), whatever the API server
// says. Stopped containers keep their record until the kubelet's garbage collection, once a
// minute; only their tasks tell whether anything still runs.
func (h *Handle) RunningContainers(ctx context.Context, namespace, pod string) ([]string, error) {
	filter := `labels."io.kubernetes.pod.namespace"==` + namespace
	if pod != "" {
		filter += `,labels."io.kubernetes.pod.name"==` + pod
	}
	ctr := func(args ...string) ([]byte, error) {
		args = append([]string{"--address", h.Containerd, "--namespace", "k8s.io"}, args...)
		out, err := exec.CommandContext(ctx, "/usr/bin/ctr", args...).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("cluster: ctr %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return out, nil
	}
	ids, err := ctr("containers", "ls", "-q", filter)
	if err != nil {
		return nil, err
	}
	tasks, err := ctr("tasks", "ls")
	if err != nil {
		return nil, err
	}
	running := map[string]bool{}
	for _, line := range strings.Split(string(tasks), "\n") {
		// TASK PID STATUS
		if f := strings.Fields(line); len(f) == 3 && f[2] != "STOPPED" {
			running[f[0]] = true
		}
	}
	var out []string
	for _, id := range strings.Fields(string(ids)) {
		if running[id] {
			out = append(out, id)
		}
	}
	return out, nil
}

// helperDir is the checkout's bin/cluster-helpers, where build.sh puts boxcar-cni, pause and
// clusterd.
func helperDir() (string, error) {
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cluster: cannot find the module folder, whose checkout holds the helpers")
	}
	dir := filepath.Join(filepath.Dir(self), "..", "..", "bin", "cluster-helpers")
	for _, name := range []string{"boxcar-cni", "pause", "clusterd"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("cluster: helper %s is not built; run test/cluster/build.sh (make test-cluster does): %w", name, err)
		}
	}
	return dir, nil
}
