// Package testnet gives tests loopback addresses that hold still: a port that refuses
// connections for the whole test, and the port a child process bound when it was given port 0.
// Tests never reserve a free port, release it and hope it stays free.
package testnet

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// ClosedAddr returns a 127.0.0.1 address that refuses connections until the test ends: a
// socket is bound to it but never listens, so the kernel answers every connect with a reset and
// no other process can take the port meanwhile.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("testnet: socket: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("testnet: bind 127.0.0.1:0: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("testnet: getsockname: %v", err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}

// ListeningAddr returns the 127.0.0.1 address process pid listens on, read from /proc: the
// sockets among its open files matched with the kernel's table of listening TCP sockets. It
// returns "" while the process listens on none yet, and an error when there is more than one.
func ListeningAddr(pid int) (string, error) {
	fds, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	if err != nil {
		return "", fmt.Errorf("testnet: open files of %d: %w", pid, err)
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "fd", fd.Name()))
		if inode, ok := strings.CutPrefix(link, "socket:["); ok && err == nil {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "net", "tcp"))
	if err != nil {
		return "", fmt.Errorf("testnet: tcp sockets of %d: %w", pid, err)
	}
	defer f.Close()
	var found []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		fields := strings.Fields(sc.Text())
		const listen = "0A"
		if len(fields) < 10 || fields[3] != listen || !inodes[fields[9]] {
			continue
		}
		ip, port, ok := strings.Cut(fields[1], ":")
		if !ok || ip != "0100007F" { // 127.0.0.1, in the kernel's byte order
			continue
		}
		p, err := strconv.ParseUint(port, 16, 16)
		if err != nil {
			return "", fmt.Errorf("testnet: port %q in /proc/%d/net/tcp: %w", port, pid, err)
		}
		found = append(found, net.JoinHostPort("127.0.0.1", strconv.FormatUint(p, 10)))
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("testnet: tcp sockets of %d: %w", pid, err)
	}
	switch len(found) {
	case 0:
		return "", nil
	case 1:
		return found[0], nil
	default:
		return "", fmt.Errorf("testnet: process %d listens on %v; expected one address", pid, found)
	}
}
