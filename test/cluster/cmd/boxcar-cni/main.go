// Command boxcar-cni is the test cluster's CNI plugin. containerd 1.6 needs an address on a
// pod's eth0 (docs/test-cluster.md, pitfall 2) and this kernel has no dummy links, so the plugin
// makes a veth pair that lives entirely inside the pod's network namespace, gives eth0 one
// address from the configured subnet (RFC 2544 space, never routed) as a /32 and adds no
// route, and turns IPv6 off on both ends. Nothing is created on the host: a pod reaches
// nothing but its own loopback.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const peerName = "boxcar0"

type netConf struct {
	CNIVersion string `json:"cniVersion"`
	Name       string `json:"name"`
	Subnet     string `json:"subnet"`
}

func main() {
	if err := run(os.Getenv("CNI_COMMAND"), os.Stdin, os.Stdout); err != nil {
		out, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "code": 999, "msg": err.Error()})
		os.Stdout.Write(out)
		os.Exit(1)
	}
}

func run(command string, stdin io.Reader, stdout io.Writer) error {
	switch command {
	case "VERSION":
		return json.NewEncoder(stdout).Encode(map[string]any{
			"cniVersion": "1.0.0", "supportedVersions": []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0"},
		})
	case "DEL", "CHECK", "GC", "STATUS":
		// The pair lives and dies with the pod's namespace: nothing to undo or check.
		return nil
	case "ADD":
	default:
		return fmt.Errorf("unknown CNI_COMMAND %q", command)
	}
	var conf netConf
	if err := json.NewDecoder(stdin).Decode(&conf); err != nil {
		return fmt.Errorf("read network config: %w", err)
	}
	ip, err := addressFor(conf.Subnet, os.Getenv("CNI_CONTAINERID"))
	if err != nil {
		return err
	}
	nsPath, ifName := os.Getenv("CNI_NETNS"), os.Getenv("CNI_IFNAME")
	mac, err := setUp(nsPath, ifName, ip)
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(map[string]any{
		"cniVersion": conf.CNIVersion,
		"interfaces": []map[string]any{{"name": ifName, "mac": mac, "sandbox": nsPath}},
		"ips":        []map[string]any{{"address": ip.String() + "/32", "interface": 0, "version": "4"}},
		"dns":        map[string]any{},
	})
}

// addressFor picks an address in subnet from the container id. Two pods may collide; nothing
// routes between pods, so a collision is harmless.
func addressFor(subnet, id string) (net.IP, error) {
	_, n, err := net.ParseCIDR(subnet)
	if err != nil || n.IP.To4() == nil {
		return nil, fmt.Errorf("subnet %q: want an IPv4 CIDR such as 198.18.0.0/16", subnet)
	}
	ones, _ := n.Mask.Size()
	h := fnv.New32a()
	h.Write([]byte(id))
	host := h.Sum32() & (1<<(32-ones) - 1)
	if host == 0 || host == 1<<(32-ones)-1 {
		host = 2
	}
	base := n.IP.To4()
	v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3]) | host
	return net.IPv4(byte(v>>24), byte(v>>16), byte(v>>8), byte(v)), nil
}

// setUp makes the pair inside the namespace at nsPath and returns eth0's MAC address.
func setUp(nsPath, ifName string, ip net.IP) (string, error) {
	runtime.LockOSThread() // namespaces belong to threads; this one never returns to the host's
	target, err := netns.GetFromPath(nsPath)
	if err != nil {
		return "", fmt.Errorf("open netns %s: %w", nsPath, err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		return "", fmt.Errorf("enter netns %s: %w", nsPath, err)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: ifName}, PeerName: peerName}
	if err := netlink.LinkAdd(veth); err != nil && !errors.Is(err, unix.EEXIST) {
		return "", fmt.Errorf("add veth %s/%s: %w", ifName, peerName, err)
	}
	// No IPv6: a link-local address and its fe80::/64 route would be a route the test did
	// not give. /proc/sys/net is the namespace of the thread that opens it.
	for _, name := range []string{ifName, peerName} {
		p := filepath.Join("/proc/sys/net/ipv6/conf", name, "disable_ipv6")
		if err := os.WriteFile(p, []byte("1"), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("disable IPv6 on %s: %w", name, err)
		}
	}
	link, err := netlink.LinkByName(ifName)
	if err != nil {
		return "", fmt.Errorf("find %s: %w", ifName, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)}, Flags: unix.IFA_F_NOPREFIXROUTE}
	if err := netlink.AddrAdd(link, addr); err != nil && !errors.Is(err, unix.EEXIST) {
		return "", fmt.Errorf("address %s on %s: %w", ip, ifName, err)
	}
	for _, name := range []string{peerName, ifName} {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return "", fmt.Errorf("find %s: %w", name, err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return "", fmt.Errorf("set %s up: %w", name, err)
		}
	}
	return link.Attrs().HardwareAddr.String(), nil
}
