package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
)

// stateBase is the parent of every run's state folder.
func stateBase() string { return filepath.Join(os.TempDir(), "boxcar-cluster") }

// Lock makes the caller the machine's only test cluster for as long as the returned file
// stays open (the process holding it exits, it is released). A node has one set of kubepods
// cgroups and the kubelet's sysctls are global: two clusters at once would tear each other
// down.
func Lock() (*os.File, error) {
	if err := os.MkdirAll(stateBase(), 0o711); err != nil {
		return nil, fmt.Errorf("cluster: state base: %w", err)
	}
	path := filepath.Join(stateBase(), "lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cluster: lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("cluster: another test cluster runs on this machine (it holds %s); wait for it to finish", path)
		}
		return nil, fmt.Errorf("cluster: lock %s: %w", path, err)
	}
	return f, nil
}

// CleanupStale tears down what earlier runs left when their supervisor died without a
// teardown (SIGKILL, a reboot). Call it holding the Lock: then no other cluster is alive.
func CleanupStale(log *slog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(stateBase(), "run-*"))
	for _, dir := range dirs {
		err := Cleanup(dir, nil)
		log.Warn("cluster: cleaned up after a run that ended without its teardown", "state", dir, "error", err)
	}
}
