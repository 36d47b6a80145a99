// Command boxcar-cni is the test cluster's CNI plugin. It gives each pod one of two networks:
//
//   - Sandbox pods (the labels in "isolate", the pods the chart's deny-all NetworkPolicy
//     selects) get a network with no route at all. containerd 1.6 needs an address on a pod's
//     eth0 (docs/test-cluster.md, pitfall 2) and this kernel has no dummy links, so the plugin
//     makes a veth pair that lives entirely inside the pod's network namespace, gives eth0 one
//     address from isolatedSubnet (RFC 2544 space, never routed) as a /32, adds no route and
//     turns IPv6 off on both ends: such a pod reaches nothing but its own loopback.
//   - Every other pod goes on the bridge: the plugin runs the standard bridge plugin (config in
//     "bridge", host-local IPAM). containerd runs in the cluster's node network namespace, and
//     so do its plugins: the bridge and the pods' veth ends exist there, not on the host.
//
// It asks the API server for the pod's labels, as the node; a pod it cannot look up gets no
// network (ADD fails, and the kubelet tries again).
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const peerName = "boxcar0"

type netConf struct {
	CNIVersion     string            `json:"cniVersion"`
	Name           string            `json:"name"`
	IsolatedSubnet string            `json:"isolatedSubnet"`
	Isolate        map[string]string `json:"isolate"`
	BinDir         string            `json:"binDir"`
	API            apiConf           `json:"api"`
	Bridge         json.RawMessage   `json:"bridge"`
}

type apiConf struct {
	Server string `json:"server"`
	CA     string `json:"ca"`
	Cert   string `json:"cert"`
	Key    string `json:"key"`
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
	case "CHECK", "GC", "STATUS":
		return nil
	case "ADD", "DEL":
	default:
		return fmt.Errorf("unknown CNI_COMMAND %q", command)
	}
	var conf netConf
	if err := json.NewDecoder(stdin).Decode(&conf); err != nil {
		return fmt.Errorf("read network config: %w", err)
	}
	if command == "DEL" {
		// The bridge plugin's DEL releases the address and is a no-op for a pod it never saw;
		// an isolated pod's pair dies with its namespace.
		return delegate(conf, stdout)
	}
	isolated, err := isolate(conf)
	if err != nil {
		return err
	}
	if !isolated {
		return delegate(conf, stdout)
	}
	ip, err := addressFor(conf.IsolatedSubnet, os.Getenv("CNI_CONTAINERID"))
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

// isolate reports whether the pod in CNI_ARGS carries every label of conf.Isolate.
func isolate(conf netConf) (bool, error) {
	args := map[string]string{}
	for _, kv := range strings.Split(os.Getenv("CNI_ARGS"), ";") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			args[k] = v
		}
	}
	ns, name := args["K8S_POD_NAMESPACE"], args["K8S_POD_NAME"]
	if ns == "" || name == "" {
		return false, errors.New("CNI_ARGS names no K8S_POD_NAMESPACE and K8S_POD_NAME: cannot tell a sandbox pod from another")
	}
	labels, err := podLabels(conf.API, ns, name)
	if err != nil {
		return false, err
	}
	for k, v := range conf.Isolate {
		if labels[k] != v {
			return false, nil
		}
	}
	return true, nil
}

func podLabels(api apiConf, ns, name string) (map[string]string, error) {
	ca, err := os.ReadFile(api.CA)
	if err != nil {
		return nil, fmt.Errorf("read API CA: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(api.Cert, api.Key)
	if err != nil {
		return nil, fmt.Errorf("read API client certificate: %w", err)
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	u := api.Server + "/api/v1/namespaces/" + url.PathEscape(ns) + "/pods/" + url.PathEscape(name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("look up pod %s/%s: %w", ns, name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("look up pod %s/%s: %s: %s", ns, name, resp.Status, body)
	}
	var pod struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&pod); err != nil {
		return nil, fmt.Errorf("decode pod %s/%s: %w", ns, name, err)
	}
	return pod.Metadata.Labels, nil
}

// delegate runs the bridge plugin with conf.Bridge, under this plugin's network name and
// version, and hands its answer on as it is.
func delegate(conf netConf, stdout io.Writer) error {
	var bridge map[string]any
	if err := json.Unmarshal(conf.Bridge, &bridge); err != nil {
		return fmt.Errorf("bridge config: %w", err)
	}
	bridge["cniVersion"], bridge["name"] = conf.CNIVersion, conf.Name
	input, err := json.Marshal(bridge)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	cmd := exec.Command(filepath.Join(conf.BinDir, "bridge"))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(input), &out, os.Stderr
	runErr := cmd.Run()
	if runErr != nil {
		// The bridge plugin's stdout is its CNI error; hand it on as it is.
		if out.Len() > 0 {
			stdout.Write(out.Bytes())
			os.Exit(1)
		}
		return fmt.Errorf("bridge plugin: %w", runErr)
	}
	_, err = stdout.Write(out.Bytes())
	return err
}

// addressFor picks an address in subnet from the container id. Two pods may collide; nothing
// routes between isolated pods, so a collision is harmless.
func addressFor(subnet, id string) (net.IP, error) {
	_, n, err := net.ParseCIDR(subnet)
	if err != nil || n.IP.To4() == nil {
		return nil, fmt.Errorf("subnet %q: want an IPv4 CIDR such as 198.18.128.0/17", subnet)
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
