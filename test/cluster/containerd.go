package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// containerdConfig is a containerd 1.6 configuration that shares nothing with another
// containerd on the machine: its own root, state, sockets, runc root and CNI folders.
// Pitfalls 1 and 7 of docs/test-cluster.md are the CRI settings.
const containerdConfig = `version = 2
root = "{{STATE}}/containerd/root"
state = "{{STATE}}/containerd/state"
# The opt plugin would install into /opt/containerd; aufs, btrfs, zfs and devmapper are not here.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{{STATE}}/containerd/containerd.sock"
[ttrpc]
  address = "{{STATE}}/containerd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "` + PauseImage + `"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # Root here lacks CAP_SYS_RESOURCE: runc must not try to lower oom_score_adj.
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  netns_mounts_under_state_dir = true
  max_container_log_line_size = 16384
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{{RUNC}}"
        Root = "{{STATE}}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{{STATE}}/cni/bin"
    conf_dir = "{{STATE}}/cni/conf"
    max_conf_num = 1
`

// cniConfig is the pod network (cmd/boxcar-cni): sandbox pods, which the chart's deny-all
// NetworkPolicy selects by these labels, get an address and no route; every other pod goes on
// the node namespace's bridge with a route to the bridge's subnet and one to the Services
// through NodeIP, and no default route. containerd (in the node namespace) adds loopback
// itself.
func (c *Cluster) cniConfig(cert, key string) ([]byte, error) {
	bridge := map[string]any{
		"type": "bridge", "bridge": bridgeName,
		// NodeIP is set on the bridge at bring-up; the plugin neither sets it nor adds a
		// default route (isGateway), and masquerades nothing (ipMasq).
		"isGateway": false, "ipMasq": false, "hairpinMode": true,
		"ipam": map[string]any{
			"type":    "host-local",
			"dataDir": c.path("cni", "ipam"),
			"ranges":  [][]map[string]string{{{"subnet": BridgeCIDR, "rangeStart": "198.18.0.16", "gateway": NodeIP}}},
			"routes":  []map[string]string{{"dst": ServiceCIDR, "gw": NodeIP}},
		},
	}
	return json.MarshalIndent(map[string]any{
		"cniVersion": "1.0.0",
		"name":       "boxcar-test",
		"plugins": []map[string]any{{
			"type":           "boxcar-cni",
			"isolatedSubnet": IsolatedCIDR,
			"isolate":        map[string]string{"app.kubernetes.io/managed-by": "boxcar", "app.kubernetes.io/component": "sandbox"},
			"binDir":         c.path("cni", "bin"),
			"api":            map[string]string{"server": nodeAPIServer, "ca": c.pki.path(caCertFile), "cert": cert, "key": key},
			"bridge":         bridge,
		}},
	}, "", "  ")
}

func (c *Cluster) startContainerd(ctx context.Context) error {
	runc, err := lookRunc()
	if err != nil {
		return err
	}
	for _, d := range []string{"containerd/root", "containerd/state", "runc", "cni/bin", "cni/conf"} {
		if err := os.MkdirAll(c.path(d), 0o711); err != nil {
			return fmt.Errorf("cluster: containerd folders: %w", err)
		}
	}
	for name, src := range map[string]string{
		"boxcar-cni": filepath.Join(c.cfg.HelperDir, "boxcar-cni"),
		"loopback":   "/usr/lib/cni/loopback",
		"bridge":     "/usr/lib/cni/bridge",
		"host-local": "/usr/lib/cni/host-local",
	} {
		if err := os.Symlink(src, c.path("cni/bin", name)); err != nil {
			return fmt.Errorf("cluster: cni plugin %s: %w", name, err)
		}
	}
	// The plugin looks pods up as the node: the Node authorizer lets it read pods bound here.
	cert, key, err := c.pki.issue("cni", "system:node:"+NodeName, []string{"system:nodes"}, false)
	if err != nil {
		return err
	}
	cniConfig, err := c.cniConfig(cert, key)
	if err != nil {
		return fmt.Errorf("cluster: cni config: %w", err)
	}
	if err := os.WriteFile(c.path("cni/conf", "10-boxcar.conflist"), cniConfig, 0o644); err != nil {
		return fmt.Errorf("cluster: cni config: %w", err)
	}
	cfg := strings.NewReplacer("{{STATE}}", c.cfg.StateDir, "{{RUNC}}", runc).Replace(containerdConfig)
	cfgPath := c.path("containerd", "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return fmt.Errorf("cluster: containerd config: %w", err)
	}
	c.containerd = c.path("containerd", "containerd.sock")
	bin, args := c.inNode("/usr/bin/containerd", "--config", cfgPath, "--log-level", "warn")
	p, err := c.start("containerd", bin, args)
	if err != nil {
		return err
	}
	return waitFor(ctx, "containerd", []*process{p}, func(ctx context.Context) (bool, error) {
		out, err := c.ctr(ctx, "version")
		return err == nil, fmt.Errorf("%w: %s", err, out)
	})
}

// Containerd is the socket of the node's containerd.
func (c *Cluster) Containerd() string { return c.containerd }

// ctr runs ctr against this cluster's containerd, in the namespace the CRI uses.
func (c *Cluster) ctr(ctx context.Context, args ...string) ([]byte, error) {
	args = append([]string{"--address", c.containerd, "--namespace", "k8s.io"}, args...)
	return exec.CommandContext(ctx, "/usr/bin/ctr", args...).CombinedOutput()
}
