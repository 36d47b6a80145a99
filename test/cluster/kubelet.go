package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeName is the node's name and the address the API server dials the kubelet by
// (docs/test-cluster.md, pitfall 3: the kubelet refuses --node-ip=127.0.0.1).
const NodeName = "localhost"

// kubeletConfig follows pitfalls 3 to 5: cgroup v1 allowed, cgroupfs, no swap check, no
// iptables chains, no resolv.conf for pods (ClusterFirst pods get CoreDNS behind kube-dns). Image garbage collection is off so that the
// imported images, which cannot be pulled again, stay; eviction thresholds are low so that a
// busy test machine does not evict the test pods.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: {{PORT}}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {{HEALTHZ}}
tlsCertFile: {{CERT}}
tlsPrivateKeyFile: {{KEY}}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: {{CA}}
authorization:
  mode: AlwaysAllow
containerRuntimeEndpoint: unix://{{SOCK}}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
makeIPTablesUtilChains: false
resolvConf: ""
clusterDNS: ["` + DNSServiceIP + `"]
clusterDomain: ` + ClusterDomain + `
podLogsDir: {{STATE}}/pod-logs
volumePluginDir: {{STATE}}/kubelet-plugins
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
podPidsLimit: ` + podPIDsLimit + `
serializeImagePulls: false
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 5s
staticPodPath: ""
`

func (c *Cluster) startKubelet(ctx context.Context) error {
	if err := c.saveSysctls(); err != nil {
		return err
	}
	// The API server dials the kubelet's port on the host's 127.0.0.1, where a relay to the
	// node namespace listens: the relay binds port 0 and the kubelet serves on the port it got.
	port, err := c.relayToNode()
	if err != nil {
		return err
	}
	cert, key, err := c.pki.issue("kubelet-serving", "system:node:"+NodeName, []string{"system:nodes"}, true)
	if err != nil {
		return err
	}
	kc, err := c.kubeconfigAt(nodeAPIServer, "kubelet", "system:node:"+NodeName, []string{"system:nodes"})
	if err != nil {
		return err
	}
	for _, d := range []string{"kubelet", "pod-logs", "kubelet-plugins"} {
		if err := os.MkdirAll(c.path(d), 0o750); err != nil {
			return fmt.Errorf("cluster: kubelet folders: %w", err)
		}
	}
	cfg := strings.NewReplacer(
		"{{PORT}}", itoa(port), "{{HEALTHZ}}", itoa(kubeletHealthz),
		"{{CERT}}", cert, "{{KEY}}", key, "{{CA}}", c.pki.path(caCertFile),
		"{{SOCK}}", c.containerd, "{{STATE}}", c.cfg.StateDir,
	).Replace(kubeletConfig)
	cfgPath := c.path("kubelet.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return fmt.Errorf("cluster: kubelet config: %w", err)
	}
	// In the node namespace the kubelet takes NodeIP, the bridge's address, as its node IP.
	bin, args := c.inNode(filepath.Join(c.cfg.BinDir, "kubelet"),
		"--config="+cfgPath,
		"--kubeconfig="+kc,
		"--hostname-override="+NodeName,
		"--node-ip="+NodeIP,
		"--root-dir="+c.path("kubelet"),
		"--cert-dir="+c.path("kubelet", "pki"),
	)
	_, err = c.start("kubelet", bin, args)
	return err
}

// waitReady waits for what a test pod needs: the node Ready and schedulable, and the default
// namespace's ServiceAccount and root CA ConfigMap (made by the controller manager).
func (c *Cluster) waitReady(ctx context.Context) error {
	err := waitFor(ctx, "node "+NodeName+" Ready", c.procs, func(ctx context.Context) (bool, error) {
		n, err := c.client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, t := range n.Spec.Taints {
			if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
				return false, fmt.Errorf("node taint %s", t.Key)
			}
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, fmt.Errorf("node Ready=%s: %s", cond.Status, cond.Message)
			}
		}
		return false, nil
	})
	if err != nil {
		return err
	}
	return waitFor(ctx, "default ServiceAccount and kube-root-ca.crt", c.procs, func(ctx context.Context) (bool, error) {
		if _, err := c.client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return false, err
		}
		_, err := c.client.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil, err
	})
}

// PodPIDsLimit is the kubelet's podPidsLimit: Kubernetes has no per-pod process bound in the
// pod spec, so this node-wide one is what bounds a sandbox pod's processes (a fork bomb).
const (
	PodPIDsLimit = 64
	podPIDsLimit = "64" // PodPIDsLimit as kubeletConfig writes it
)
