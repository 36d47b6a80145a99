// Package cluster runs a real single-node Kubernetes for tests: etcd, kube-apiserver (with
// PodSecurity admission), kube-controller-manager, kube-scheduler, a private containerd and a
// kubelet, all on 127.0.0.1, with state under one folder. Pods get a network namespace with an
// address and no route (see cmd/boxcar-cni), and images come from local tarballs, so nothing in
// the cluster reaches past the machine.
//
// It does not build Kubernetes (build.sh does, once, into a cache) and does not install the
// Debian parts (build.sh does that too). Tests use it through Launch, which runs the cluster in
// a supervisor process (cmd/clusterd) that tears it down when the test binary exits, however it
// exits.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
)

// Versions of the parts this package is written against.
const (
	KubernetesVersion = "v1.37.2"
	// SandboxImage is the busybox image every node has; pods must use imagePullPolicy Never
	// or IfNotPresent.
	SandboxImage = "boxcar.test/sandbox:1"
	// PauseImage is the pod sandbox image containerd uses.
	PauseImage = "boxcar.test/pause:1"
	// PodCIDR is where pod addresses come from: RFC 2544 benchmark space, never routed off
	// the node namespace (BridgeCIDR and IsolatedCIDR split it).
	PodCIDR = "198.18.0.0/16"
	// ServiceCIDR holds service addresses, which kube-proxy's rules in the node namespace
	// translate to pod addresses.
	ServiceCIDR = "198.19.0.0/24"
)

// Config says where the cluster's parts are and where its state goes.
type Config struct {
	// BinDir holds kube-apiserver, kubelet, kube-scheduler, kube-controller-manager and
	// kube-proxy.
	// Default: $BOXCAR_CLUSTER_CACHE/v1.37.2/bin, else ~/.cache/boxcar-cluster/v1.37.2/bin.
	BinDir string
	// HelperDir holds boxcar-cni and pause, built from this module's cmd folder. Required.
	HelperDir string
	// StateDir is created and holds everything the cluster writes. Required; removed by Stop.
	StateDir string
	// LogDir receives one log file per component. Default: StateDir/logs.
	LogDir string
	// StartTimeout bounds the bring-up. Default: 3m.
	StartTimeout time.Duration
	// Logger receives bring-up and teardown events. Default: discards.
	Logger *slog.Logger
}

// WithDefaults returns a copy with every unset field at its documented default.
func (c Config) WithDefaults() Config {
	if c.BinDir == "" {
		c.BinDir = filepath.Join(CacheDir(), KubernetesVersion, "bin")
	}
	if c.LogDir == "" && c.StateDir != "" {
		c.LogDir = filepath.Join(c.StateDir, "logs")
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = 3 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// CacheDir is where build.sh puts the Kubernetes binaries.
func CacheDir() string {
	if d := os.Getenv("BOXCAR_CLUSTER_CACHE"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "boxcar-cluster-cache")
	}
	return filepath.Join(home, ".cache", "boxcar-cluster")
}

// Cluster is a running cluster.
type Cluster struct {
	cfg   Config
	log   *slog.Logger
	pki   *pki
	procs []*process // in start order; stopped in reverse
	saved sysctls

	relays     []net.Listener // between the host's and the node's namespaces
	etcdURL    string
	client     kubernetes.Interface
	containerd string // containerd's socket

	// Kubeconfig is an admin kubeconfig for the cluster.
	Kubeconfig string
	// APIServer is the https URL of the API server.
	APIServer string
	// Timings records how long the bring-up steps took.
	Timings map[string]time.Duration
}

// Start brings the cluster up and returns once the node is Ready and the default
// ServiceAccount exists. On error, whatever was started is stopped again.
func Start(ctx context.Context, cfg Config) (c *Cluster, err error) {
	cfg = cfg.WithDefaults()
	if cfg.StateDir == "" || cfg.HelperDir == "" {
		return nil, errors.New("cluster: Config.StateDir and Config.HelperDir are required")
	}
	if err := checkParts(cfg); err != nil {
		return nil, err
	}
	for _, d := range []string{cfg.StateDir, cfg.LogDir} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("cluster: state folder: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	c = &Cluster{cfg: cfg, log: cfg.Logger, Timings: map[string]time.Duration{}}
	defer func() {
		if err != nil {
			// What the teardown could not undo is left on the machine: the caller hears of it.
			err = errors.Join(err, c.Stop(context.WithoutCancel(ctx)))
			c = nil
		}
	}()
	begin := time.Now()
	if c.pki, err = newPKI(filepath.Join(cfg.StateDir, "pki")); err != nil {
		return c, err
	}
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"etcd", c.startEtcd},
		{"apiserver", c.startAPIServer},
		{"controllers", c.startControllers},
		{"node network", c.startNodeNetwork},
		{"containerd", c.startContainerd},
		{"images", c.importImages},
		{"kubelet", c.startKubelet},
		{"services", c.createClusterServices},
		{"kube-proxy", c.startKubeProxy},
		{"coredns", c.startCoreDNS},
		{"ready", c.waitReady},
	}
	for _, s := range steps {
		t := time.Now()
		if err := s.fn(ctx); err != nil {
			return c, err
		}
		c.Timings[s.name] = time.Since(t)
	}
	c.Timings["total"] = time.Since(begin)
	c.log.Info("cluster: up", "duration_ms", c.Timings["total"].Milliseconds(), "kubeconfig", c.Kubeconfig)
	return c, nil
}

// path is a path under the state folder.
func (c *Cluster) path(elem ...string) string {
	return filepath.Join(append([]string{c.cfg.StateDir}, elem...)...)
}

func (c *Cluster) start(name, bin string, args []string, env ...string) (*process, error) {
	p, err := startProcess(c.log, c.cfg.LogDir, name, bin, args, env)
	if err != nil {
		return nil, err
	}
	c.procs = append(c.procs, p)
	return p, nil
}

// checkParts fails with the command that installs or builds what is missing.
func checkParts(cfg Config) error {
	var missing []string
	for _, b := range []string{"kube-apiserver", "kubelet", "kube-scheduler", "kube-controller-manager", "kube-proxy"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			missing = append(missing, b)
		}
	}
	if _, err := os.Stat(coreDNSBin()); err != nil {
		missing = append(missing, coreDNSBin())
	}
	if len(missing) > 0 {
		return fmt.Errorf("cluster: %v not in %s: run test/cluster/build.sh (or make test-cluster): %w", missing, cfg.BinDir, errMissingTool)
	}
	debs := map[string]string{
		"/usr/bin/containerd": "containerd", "/usr/bin/ctr": "containerd", "/usr/bin/etcd": "etcd-server",
		"/usr/lib/cni/loopback": "containernetworking-plugins", "/usr/lib/cni/bridge": "containernetworking-plugins",
		"/usr/lib/cni/host-local": "containernetworking-plugins", "/bin/busybox": "busybox-static",
		"/usr/sbin/iptables-restore": "iptables", "/usr/bin/nsenter": "util-linux",
	}
	var pkgs []string
	for file, pkg := range debs {
		if _, err := os.Stat(file); err != nil {
			pkgs = append(pkgs, pkg)
		}
	}
	if _, err := lookRunc(); err != nil {
		pkgs = append(pkgs, "runc")
	}
	if len(pkgs) > 0 {
		return fmt.Errorf("cluster: Debian packages missing: run apt-get update && apt-get install -y %v (or make test-cluster as root): %w", pkgs, errMissingTool)
	}
	for _, h := range []string{"boxcar-cni", "pause"} {
		if _, err := os.Stat(filepath.Join(cfg.HelperDir, h)); err != nil {
			return fmt.Errorf("cluster: helper %s not in %s: run test/cluster/build.sh, which builds it: %w", h, cfg.HelperDir, errMissingTool)
		}
	}
	return nil
}

func lookRunc() (string, error) {
	for _, p := range []string{"/usr/sbin/runc", "/usr/bin/runc"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("runc not found")
}
