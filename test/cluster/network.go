package cluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The node lives in a network namespace the cluster makes (pitfall 10 of docs/test-cluster.md):
// containerd, the kubelet, kube-proxy and its iptables rules, CoreDNS, the bridge and the pods'
// veth ends are all in there, so the host's own namespace gains no link, address, route or
// rule, and the kubelet's probes reach pods over the bridge. The control plane stays on the
// host's 127.0.0.1; two relays join the two: the API server for the node (at NodeIP), and the
// kubelet for the API server (at the host's 127.0.0.1, the kubelet's port).
const (
	// NodeIP is the bridge's address in the node namespace: the pods' gateway to Services,
	// where CoreDNS answers and where the relay to the API server listens.
	NodeIP = "198.18.0.1"
	// BridgeCIDR holds the addresses of pods on the bridge (host-local IPAM).
	BridgeCIDR = "198.18.0.0/17"
	// IsolatedCIDR holds the addresses of sandbox pods, which get no route at all.
	IsolatedCIDR = "198.18.128.0/17"
	// KubernetesServiceIP is the first address of ServiceCIDR, the default/kubernetes Service.
	KubernetesServiceIP = "198.19.0.1"
	// DNSServiceIP is the kube-dns Service's address, the kubelet's clusterDNS.
	DNSServiceIP = "198.19.0.10"
	// ClusterDomain is the DNS domain of Services.
	ClusterDomain = "cluster.local"
	// RelayPort is the port of the API server relay at NodeIP.
	RelayPort = 6443

	bridgeName = "cbr0"
	nodeNetns  = "netns/node"
)

// startNodeNetwork makes the node namespace, its bridge and the API server relay in it.
func (c *Cluster) startNodeNetwork(ctx context.Context) error {
	if err := os.MkdirAll(c.path("netns"), 0o711); err != nil {
		return fmt.Errorf("cluster: netns folder: %w", err)
	}
	f, err := os.Create(c.path(nodeNetns))
	if err != nil {
		return fmt.Errorf("cluster: node netns file: %w", err)
	}
	f.Close()
	apiAddr := c.APIServer[len("https://"):]
	l, err := c.inNewNetns(c.path(nodeNetns), setUpNode)
	if err != nil {
		return err
	}
	c.relays = append(c.relays, l)
	go relay(l, func() (net.Conn, error) { return net.Dial("tcp", apiAddr) })
	return nil
}

// relayToNode listens on a port of the host's 127.0.0.1 that the kernel picks, relays to the
// same port on the node namespace's 127.0.0.1, where the kubelet is to serve, and returns the
// port. In the node namespace the other servers listen on fixed ports below the kernel's
// ephemeral range; only containerd's stream server takes a port 0 there, the same number by a
// chance of about one in 28,000, which shows as a kubelet that exits at start.
func (c *Cluster) relayToNode() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("cluster: relay to the node's kubelet: %w", err)
	}
	c.relays = append(c.relays, l)
	port := l.Addr().(*net.TCPAddr).Port
	addr := net.JoinHostPort("127.0.0.1", itoa(port))
	go relay(l, func() (net.Conn, error) { return c.dialNode(context.Background(), "tcp", addr) })
	return port, nil
}

// inNewNetns makes a network namespace pinned at path, runs setup in it and opens the relay
// listener there. The thread that did it exits with its goroutine (it stays locked), so no
// other goroutine ever runs in the node namespace.
func (c *Cluster) inNewNetns(path string, setup func() error) (net.Listener, error) {
	type result struct {
		l   net.Listener
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		l, err := func() (net.Listener, error) {
			host, err := netns.Get()
			if err != nil {
				return nil, fmt.Errorf("cluster: host netns: %w", err)
			}
			defer host.Close()
			node, err := netns.New()
			if err != nil {
				return nil, fmt.Errorf("cluster: new netns: %w", err)
			}
			defer node.Close()
			// A failed restore leaves the thread in the node namespace; it ends with the goroutine.
			defer func() { _ = netns.Set(host) }()
			self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
			if err := unix.Mount(self, path, "", unix.MS_BIND, ""); err != nil {
				return nil, fmt.Errorf("cluster: pin netns at %s: %w", path, err)
			}
			if err := setup(); err != nil {
				return nil, err
			}
			l, err := net.Listen("tcp", net.JoinHostPort(NodeIP, itoa(RelayPort)))
			if err != nil {
				return nil, fmt.Errorf("cluster: relay listener: %w", err)
			}
			return l, nil
		}()
		done <- result{l, err}
	}()
	r := <-done
	return r.l, r.err
}

// setUpNode runs in the new node namespace: loopback up, the bridge with NodeIP, forwarding
// and bridged traffic through iptables (kube-proxy's rules see pod-to-Service replies), no
// IPv6.
func setUpNode() error {
	for _, s := range []struct{ key, value string }{
		{"net/ipv6/conf/all/disable_ipv6", "1"},
		{"net/ipv6/conf/default/disable_ipv6", "1"},
		{"net/ipv4/ip_forward", "1"},
		{"net/bridge/bridge-nf-call-iptables", "1"},
	} {
		// /proc/sys/net is the namespace of the thread that opens it.
		if err := os.WriteFile(filepath.Join("/proc/sys", s.key), []byte(s.value), 0o644); err != nil {
			return fmt.Errorf("cluster: node netns sysctl %s: %w", s.key, err)
		}
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("cluster: node netns loopback: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("cluster: node netns loopback up: %w", err)
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridgeName}}
	if err := netlink.LinkAdd(br); err != nil {
		return fmt.Errorf("cluster: bridge %s: %w", bridgeName, err)
	}
	_, subnet, _ := net.ParseCIDR(BridgeCIDR)
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(NodeIP), Mask: subnet.Mask}}
	if err := netlink.AddrAdd(br, addr); err != nil {
		return fmt.Errorf("cluster: address %s on %s: %w", NodeIP, bridgeName, err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return fmt.Errorf("cluster: bridge up: %w", err)
	}
	return nil
}

// relay copies each connection l accepts to one dial makes, in both directions. TLS passes
// through untouched, so clients check the API server's and the kubelet's own certificates.
func relay(l net.Listener, dial func() (net.Conn, error)) {
	for {
		in, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer in.Close()
			out, err := dial()
			if err != nil {
				return
			}
			defer out.Close()
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(out, in)
				_ = out.(*net.TCPConn).CloseWrite()
			}()
			_, _ = io.Copy(in, out)
			_ = in.(*net.TCPConn).CloseWrite()
			wg.Wait()
		}()
	}
}

// dialNode connects to addr from inside the node namespace: the kubelet relay, and the
// bring-up's readiness checks of kube-proxy and CoreDNS.
func (c *Cluster) dialNode(ctx context.Context, network, addr string) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		conn, err := func() (net.Conn, error) {
			host, err := netns.Get()
			if err != nil {
				return nil, err
			}
			defer host.Close()
			node, err := netns.GetFromPath(c.path(nodeNetns))
			if err != nil {
				return nil, err
			}
			defer node.Close()
			if err := netns.Set(node); err != nil {
				return nil, err
			}
			defer func() { _ = netns.Set(host) }() // as in inNewNetns: the thread ends anyway
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}()
		done <- result{conn, err}
	}()
	r := <-done
	if r.err != nil {
		return nil, fmt.Errorf("cluster: dial %s in the node netns: %w", addr, r.err)
	}
	return r.conn, nil
}

// inNode is the command line that runs bin with args in the node namespace.
func (c *Cluster) inNode(bin string, args ...string) (string, []string) {
	return "/usr/bin/nsenter", append([]string{"--net=" + c.path(nodeNetns), "--", bin}, args...)
}
