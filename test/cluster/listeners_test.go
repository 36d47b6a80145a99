package cluster_test

import (
	"bufio"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestListenersLoopbackOnly checks the rule that every server of the cluster listens on
// 127.0.0.1: it finds the cluster's processes (their command lines name its state folder),
// their sockets, and every TCP socket of theirs that listens.
func TestListenersLoopbackOnly(t *testing.T) {
	state := filepath.Dir(kube.Kubeconfig)
	inodes := map[string]string{} // socket inode -> process
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	procs := map[string]bool{}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if !strings.Contains(string(cmdline), state) {
			continue
		}
		name := filepath.Base(strings.SplitN(string(cmdline), "\x00", 2)[0])
		procs[name] = true
		fds, _ := os.ReadDir(filepath.Join("/proc", e.Name(), "fd"))
		for _, fd := range fds {
			link, _ := os.Readlink(filepath.Join("/proc", e.Name(), "fd", fd.Name()))
			if ino, ok := strings.CutPrefix(link, "socket:["); ok {
				inodes[strings.TrimSuffix(ino, "]")] = name
			}
		}
	}
	for _, want := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "containerd", "kubelet"} {
		if !procs[want] {
			t.Errorf("found no %s process naming %s; found %v", want, state, procs)
		}
	}
	listening := 0
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			t.Fatal(err)
		}
		s := bufio.NewScanner(f)
		for s.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(s.Text())
			if len(fields) < 10 || fields[3] != "0A" { // 0A: LISTEN
				continue
			}
			owner, ours := inodes[fields[9]]
			if !ours {
				continue
			}
			listening++
			if ip := procNetIP(fields[1]); !ip.IsLoopback() {
				t.Errorf("%s listens on %s, want 127.0.0.1 only", owner, ip)
			}
		}
		f.Close()
	}
	if listening == 0 {
		t.Error("found no listening socket of the cluster; the check sees nothing")
	}
	t.Logf("%d listening sockets of %d cluster processes, all on loopback", listening, len(procs))
}

// procNetIP decodes the address of "ADDR:PORT" in /proc/net/tcp{,6}: 32-bit words in host
// (little-endian) order.
func procNetIP(field string) net.IP {
	addr, _, _ := strings.Cut(field, ":")
	b, err := hex.DecodeString(addr)
	if err != nil {
		return nil
	}
	for i := 0; i+4 <= len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	return net.IP(b)
}
