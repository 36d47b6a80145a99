//go:build integration

package sandbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// Audit (session 22, area "contain"): tests that fail on today's code. Run with
//
//	go test -tags integration -count=1 -run 'TestAuditContain' ./internal/sandbox

// auditMarkedPIDs lists the host's processes whose environment holds AUDIT_MARK=mark.
func auditMarkedPIDs(mark string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		environ, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err == nil && strings.Contains(string(environ), "AUDIT_MARK="+mark+"\x00") {
			pids = append(pids, pid)
		}
	}
	return pids
}

func auditMark() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "audit-" + hex.EncodeToString(b[:])
}

// TestAuditContainDevTmpfsUnbounded: bwrap's --dev makes /dev a tmpfs of its own, writable by
// the sandbox's user (it owns it) and with no size= (bwrap's --size applies to the next tmpfs
// only, which the backend gives to /tmp). Where no memory cgroup bounds the sandbox (a host
// without cgroup delegation, a worker that is not root: "rlimits only"), RLIMIT_AS does not
// count tmpfs pages, so a command of a 128 MiB / 16 MiB sandbox parks any amount of the host's
// RAM in /dev/shm (files under RLIMIT_FSIZE each), up to half the host's memory, for as long as it runs. Judged on the host:
// statfs of the command's /dev through /proc/<pid>/root.
func TestAuditContainDevTmpfsUnbounded(t *testing.T) {
	t.Parallel()
	const (
		memBound  = 128 << 20
		diskBound = 16 << 20
		write     = 384 << 20
	)
	for _, mode := range boundModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t, mode.edit), bombSpec)
			t.Logf("isolation: %s", sb.Info().Isolation)
			mark := auditMark()
			ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
			done := make(chan struct{})
			go func() {
				defer close(done)
				res, err := sb.Exec(ctx, sandbox.ExecRequest{
					Argv: []string{"sh", "-c", "for i in $(seq " + strconv.Itoa(write/(8<<20)) + "); do head -c 8388608 /dev/zero > /dev/shm/f$i || break; done; echo files $i >&2; : > written; sleep 60"},
					Env:  map[string]string{"AUDIT_MARK": mark}, Timeout: 90 * time.Second, MaxOutputBytes: 4096,
				})
				t.Logf("exec: exit %d, err %v, stderr %q", res.ExitCode, err, res.Stderr)
			}()
			defer func() { cancel(); <-done }()
			deadline := time.Now().Add(60 * time.Second)
			for {
				if _, err := sb.ReadFile(ctx, "written", 10); err == nil {
					break
				}
				select {
				case <-done:
					return // the command was stopped before it wrote it all (a memory cgroup's OOM kill)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatal("the command did not get past its write within 60s")
				}
				time.Sleep(100 * time.Millisecond)
			}
			var peak int64
			for _, pid := range auditMarkedPIDs(mark) {
				var st unix.Statfs_t
				if err := unix.Statfs(filepath.Join("/proc", strconv.Itoa(pid), "root", "dev"), &st); err != nil {
					continue
				}
				peak = max(peak, int64(st.Blocks-st.Bfree)*st.Bsize)
			}
			t.Logf("the sandbox's /dev holds %d bytes of the host's memory (memory bound %d, disk bound %d)", peak, memBound, diskBound)
			if peak > memBound+diskBound {
				t.Errorf("a command of a sandbox bounded to %d bytes of memory and %d of disk holds %d bytes in its /dev tmpfs; want the write refused at the sandbox's bounds",
					memBound, diskBound, peak)
			}
		})
	}
}
