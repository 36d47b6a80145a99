package cluster_test

import (
	"bufio"
	"encoding/hex"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/test/cluster"
)

// TestListenersLoopbackOnly checks the rule that every server of the cluster listens on
// 127.0.0.1: it finds the cluster's processes (their command lines name its state folder),
// their sockets, and every TCP socket of theirs that listens. In the node namespace (kube-proxy,
// CoreDNS, the API server relay) a server may also listen on the node's own address, which
// only the cluster's pods can reach.
func TestListenersLoopbackOnly(t *testing.T) {
	state := filepath.Dir(kube.Kubeconfig)
	hostNetns, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	// network namespace -> pids in it, whose /proc/PID/net shows it. Several, because a pid may
	// end before its table is read: the shim of a pod an earlier test deleted.
	netnsPids := map[string][]string{}
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
		if ns, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "net")); err == nil {
			netnsPids[ns] = append(netnsPids[ns], e.Name())
		}
		fds, _ := os.ReadDir(filepath.Join("/proc", e.Name(), "fd"))
		for _, fd := range fds {
			link, _ := os.Readlink(filepath.Join("/proc", e.Name(), "fd", fd.Name()))
			if ino, ok := strings.CutPrefix(link, "socket:["); ok {
				inodes[strings.TrimSuffix(ino, "]")] = name
			}
		}
	}
	for _, want := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "containerd", "kubelet", "kube-proxy", "coredns"} {
		if !procs[want] {
			t.Errorf("found no %s process naming %s; found %v", want, state, procs)
		}
	}
	if len(netnsPids) != 2 {
		t.Errorf("the cluster's processes are in %d network namespaces, want 2 (the host's and the node's)", len(netnsPids))
	}
	listening := 0
	for ns, pids := range netnsPids {
		listening += checkListeners(t, pids, ns == hostNetns, inodes)
	}
	if listening == 0 {
		t.Error("found no listening socket of the cluster; the check sees nothing")
	}
	t.Logf("%d listening sockets of %d cluster processes, all on loopback or the node address", listening, len(procs))
}

// checkListeners checks the listening TCP sockets of inodes in the network namespace of pids,
// reading its tables through the first of them still running.
func checkListeners(t *testing.T, pids []string, host bool, inodes map[string]string) int {
	t.Helper()
	listening := 0
	for _, table := range []string{"tcp", "tcp6"} {
		var f *os.File
		var err error
		for _, pid := range pids {
			if f, err = os.Open(filepath.Join("/proc", pid, "net", table)); !errors.Is(err, fs.ErrNotExist) {
				break
			}
		}
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
			ip := procNetIP(fields[1])
			switch {
			case ip.IsLoopback():
			case !host && ip.String() == cluster.NodeIP:
			case host:
				t.Errorf("%s listens on %s in the host's namespace, want 127.0.0.1 only", owner, ip)
			default:
				t.Errorf("%s listens on %s in the node namespace, want 127.0.0.1 or %s only", owner, ip, cluster.NodeIP)
			}
		}
		f.Close()
	}
	return listening
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
