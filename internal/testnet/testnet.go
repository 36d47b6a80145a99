// Package testnet gives tests loopback addresses that hold still: a port that refuses
// connections for the whole test, and the port a child process bound when it was given port 0.
// Tests never reserve a free port, release it and hope it stays free.
package testnet

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
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
	all, err := ListeningAddrs(pid)
	if err != nil {
		return "", err
	}
	var found []string
	for _, a := range all {
		if host, _, _ := net.SplitHostPort(a); host == "127.0.0.1" {
			found = append(found, a)
		}
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

// ListeningAddrs returns every TCP address, IPv4 or IPv6, process pid listens on, read from
// /proc as ListeningAddr does: a test holds a child process to the ports it was given, since a
// port the child picks itself collides with another test's child running at the same time.
func ListeningAddrs(pid int) ([]string, error) {
	fds, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	if err != nil {
		return nil, fmt.Errorf("testnet: open files of %d: %w", pid, err)
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "fd", fd.Name()))
		if inode, ok := strings.CutPrefix(link, "socket:["); ok && err == nil {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	var found []string
	for _, table := range []string{"tcp", "tcp6"} {
		addrs, err := listening(filepath.Join("/proc", strconv.Itoa(pid), "net", table), inodes)
		if err != nil {
			return nil, fmt.Errorf("testnet: %s sockets of %d: %w", table, pid, err)
		}
		found = append(found, addrs...)
	}
	return found, nil
}

// listening reads a kernel table of TCP sockets (proc_net_tcp(5)) and returns the addresses
// of the listening ones among inodes.
func listening(path string, inodes map[string]bool) ([]string, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) && strings.HasSuffix(path, "6") {
		return nil, nil // a kernel without IPv6
	}
	if err != nil {
		return nil, err
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
		addr, err := kernelAddr(fields[1])
		if err != nil {
			return nil, err
		}
		found = append(found, addr)
	}
	return found, sc.Err()
}

// kernelAddr turns a local_address of /proc/net/tcp or tcp6 (the address as 32-bit words in
// the host's byte order, in hex, then the port) into host:port.
func kernelAddr(field string) (string, error) {
	hexIP, hexPort, ok := strings.Cut(field, ":")
	raw, err := hex.DecodeString(hexIP)
	if !ok || err != nil || (len(raw) != net.IPv4len && len(raw) != net.IPv6len) {
		return "", fmt.Errorf("address %q: not an address", field)
	}
	port, err := strconv.ParseUint(hexPort, 16, 16)
	if err != nil {
		return "", fmt.Errorf("address %q: %w", field, err)
	}
	ip := make(net.IP, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.BigEndian.PutUint32(ip[i:], binary.NativeEndian.Uint32(raw[i:]))
	}
	return net.JoinHostPort(ip.String(), strconv.FormatUint(port, 10)), nil
}
