package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// sysctls the kubelet rewrites at start, whatever its configuration says (pitfall 5).
var kubeletSysctls = []string{"kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory"}

// sysctls maps a /proc/sys path to its value before the kubelet started.
type sysctls map[string]string

const sysctlFile = "sysctls.json"

// saveSysctls records the values the kubelet will change, in memory and in the state folder
// (Cleanup restores from there after a crash).
func (c *Cluster) saveSysctls() error {
	c.saved = sysctls{}
	for _, k := range kubeletSysctls {
		v, err := os.ReadFile(filepath.Join("/proc/sys", k))
		if err != nil {
			return fmt.Errorf("cluster: read sysctl %s: %w", k, err)
		}
		c.saved[k] = strings.TrimSpace(string(v))
	}
	data, _ := json.Marshal(c.saved)
	if err := os.WriteFile(c.path(sysctlFile), data, 0o600); err != nil {
		return fmt.Errorf("cluster: save sysctls: %w", err)
	}
	return nil
}

func restoreSysctls(saved sysctls) error {
	var errs []error
	for k, v := range saved {
		cur, _ := os.ReadFile(filepath.Join("/proc/sys", k))
		if strings.TrimSpace(string(cur)) == v {
			continue
		}
		if err := os.WriteFile(filepath.Join("/proc/sys", k), []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("cluster: restore sysctl %s=%s: %w", k, v, err))
		}
	}
	return errors.Join(errs...)
}

// Stop tears the cluster down: pods deleted while the kubelet still runs, every process
// stopped, the containers' shims killed, the sysctls restored, everything mounted under the
// state folder unmounted, the kubepods cgroups removed and the state folder deleted. It
// returns what it could not undo.
func (c *Cluster) Stop(ctx context.Context) error {
	if c.client != nil && c.running("kubelet") {
		// The kubelet stops containers properly; a bounded wait, then the hard way below.
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		c.deleteAllPods(dctx)
		cancel()
	}
	for _, p := range slices.Backward(c.procs) {
		p.stop(10 * time.Second)
	}
	for _, l := range c.relays {
		l.Close()
	}
	c.log.Info("cluster: processes stopped")
	err := Cleanup(c.cfg.StateDir, c.saved)
	c.log.Info("cluster: torn down", "error", err)
	return err
}

func (c *Cluster) running(name string) bool {
	for _, p := range c.procs {
		if p.name == name {
			return p.exited() == nil
		}
	}
	return false
}

func (c *Cluster) deleteAllPods(ctx context.Context) {
	var zero int64
	nss, err := c.client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, ns := range nss.Items {
		_ = c.client.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	}
	_ = waitFor(ctx, "pods gone", nil, func(ctx context.Context) (bool, error) {
		pods, err := c.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0, err
	})
}

// Cleanup undoes what a cluster with this state folder left on the machine, for Stop and for
// a supervisor that finds the folder of a crashed run: processes still using the folder
// (container shims, the containers) are killed, the sysctls restored (from saved, else from
// the folder's record), mounts under the folder detached, kubepods cgroups removed and the
// folder deleted.
func Cleanup(stateDir string, saved sysctls) error {
	var errs []error
	killUsers(stateDir)
	if saved == nil {
		if data, err := os.ReadFile(filepath.Join(stateDir, sysctlFile)); err == nil {
			_ = json.Unmarshal(data, &saved)
		}
	}
	if err := restoreSysctls(saved); err != nil {
		errs = append(errs, err)
	}
	if err := unmountUnder(stateDir); err != nil {
		errs = append(errs, err)
	}
	if err := removeKubepods(); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(stateDir); err != nil {
		errs = append(errs, fmt.Errorf("cluster: remove %s: %w", stateDir, err))
	}
	return errors.Join(errs...)
}

// killUsers kills every process whose command line names the state folder (containerd, its
// shims, the kubelet) and every process in a kubepods cgroup (the containers). Nothing else
// on the machine matches either: the folder is unique to this cluster, and kubepods cgroups
// belong to a kubelet, of which this machine runs only the test cluster's.
func killUsers(stateDir string) {
	for range 3 {
		var pids []int
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			cgroup, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
			if strings.Contains(string(cmdline), stateDir) || strings.Contains(string(cgroup), ":/kubepods") {
				pids = append(pids, pid)
			}
		}
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(200 * time.Millisecond) // let the kernel reap them before looking again
	}
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) error {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return fmt.Errorf("cluster: read mounts: %w", err)
	}
	points := make([]string, len(mounts))
	for i, m := range mounts {
		points[i] = m.Mountpoint
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, mp := range points {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("cluster: unmount %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// removeKubepods removes the kubepods cgroup trees the kubelet made, leaves first.
func removeKubepods() error {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	if _, err := os.Stat("/sys/fs/cgroup/kubepods"); err == nil {
		roots = append(roots, "/sys/fs/cgroup/kubepods") // cgroup v2
	}
	var errs []error
	for _, root := range roots {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for _, d := range slices.Backward(dirs) {
			if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("cluster: remove cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}
