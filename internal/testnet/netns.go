package testnet

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Netns is a network namespace the test made, joined to the host's by a veth pair on a /30
// of 198.19.128.0/17, in 198.18.0.0/15 (the benchmarking range, which no real host uses): the
// host's end is HostAddr, the namespace's Addr. Servers the test starts in it are reachable from the host
// at Addr, and nothing else is there.
type Netns struct {
	Name     string
	Addr     netip.Addr
	HostAddr netip.Addr
}

// NewNetns makes a namespace and removes it when the test ends. It needs root (CAP_NET_ADMIN)
// and iproute2's ip; without them the test fails, saying so.
func NewNetns(t testing.TB) *Netns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("testnet: a network namespace needs root; run these tests as root")
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		t.Fatal("testnet: ip (iproute2) not found; apt-get install -y iproute2")
	}
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	// A random /30 of 198.19.128.0/17, so that tests running at once do not collide. The rest
	// of 198.18.0.0/15 is the test cluster's (pods and services, test/cluster/network.go),
	// whose absence from the host's namespace TestHostNetworkUntouched checks.
	base := netip.AddrFrom4([4]byte{198, 19, 128 | b[1]&127, b[2] &^ 3})
	n := &Netns{Name: fmt.Sprintf("boxcar-t-%x", b), HostAddr: base.Next(), Addr: base.Next().Next()}
	host, peer := "bxh"+fmt.Sprintf("%x", b), "bxn"+fmt.Sprintf("%x", b)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.CommandContext(context.Background(), ip, args...).CombinedOutput(); err != nil {
			t.Fatalf("testnet: ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", n.Name)
	// Cleanups run after the test's context has ended.
	t.Cleanup(func() { _ = exec.CommandContext(context.Background(), ip, "netns", "del", n.Name).Run() })
	run("link", "add", host, "type", "veth", "peer", "name", peer, "netns", n.Name)
	t.Cleanup(func() { _ = exec.CommandContext(context.Background(), ip, "link", "del", host).Run() })
	run("addr", "add", n.HostAddr.String()+"/30", "dev", host)
	run("link", "set", host, "up")
	run("-n", n.Name, "addr", "add", n.Addr.String()+"/30", "dev", peer)
	run("-n", n.Name, "link", "set", peer, "up")
	run("-n", n.Name, "link", "set", "lo", "up")
	return n
}

// Listen opens a listener (network "tcp" or "udp") at the namespace's Addr and port; it is
// closed when the test ends. The socket belongs to the namespace for good, whichever
// goroutine serves it.
func (n *Netns) Listen(t testing.TB, network string, port int) any {
	t.Helper()
	addr := net.JoinHostPort(n.Addr.String(), fmt.Sprint(port))
	var ln any
	err := n.inside(func() error {
		var err error
		var lc net.ListenConfig
		if network == "udp" {
			ln, err = lc.ListenPacket(context.Background(), "udp", addr)
		} else {
			ln, err = lc.Listen(context.Background(), "tcp", addr)
		}
		return err
	})
	if err != nil {
		t.Fatalf("testnet: listen %s %s in %s: %v", network, addr, n.Name, err)
	}
	t.Cleanup(func() { _ = ln.(interface{ Close() error }).Close() })
	return ln
}

// inside runs f on a thread that has entered the namespace; the thread is not reused after.
func (n *Netns) inside(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		fd, err := unix.Open("/run/netns/"+n.Name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	return <-errc
}
