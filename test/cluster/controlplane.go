package cluster

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func (c *Cluster) startEtcd(ctx context.Context) error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	client := "http://127.0.0.1:" + itoa(ports[0])
	peer := "http://127.0.0.1:" + itoa(ports[1])
	p, err := c.start("etcd", "/usr/bin/etcd", []string{
		"--name=boxcar-test",
		"--data-dir=" + c.path("etcd"),
		"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=boxcar-test=" + peer,
		"--listen-metrics-urls=http://127.0.0.1:" + itoa(ports[2]),
		"--log-level=warn",
	})
	if err != nil {
		return err
	}
	c.etcdURL = client
	return waitFor(ctx, "etcd health", []*process{p}, func(ctx context.Context) (bool, error) {
		return httpOK(ctx, http.DefaultClient, client+"/health")
	})
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	cert, key, err := c.pki.issue("apiserver", "kube-apiserver", nil, true)
	if err != nil {
		return err
	}
	kcert, kkey, err := c.pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, false)
	if err != nil {
		return err
	}
	c.APIServer = "https://127.0.0.1:" + itoa(ports[0])
	p, err := c.start("kube-apiserver", filepath.Join(c.cfg.BinDir, "kube-apiserver"), []string{
		"--etcd-servers=" + c.etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port=" + itoa(ports[0]),
		"--tls-cert-file=" + cert, "--tls-private-key-file=" + key,
		"--client-ca-file=" + c.pki.path(caCertFile),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + c.pki.path(saPubFile),
		"--service-account-signing-key-file=" + c.pki.path(saKeyFile),
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--authorization-mode=Node,RBAC",
		// PodSecurity is on by default; naming it keeps it on whatever the defaults become.
		"--enable-admission-plugins=NodeRestriction,PodSecurity",
		// Privileged pods are allowed by the server so that Pod Security admission, not this
		// flag, is what rejects them in the tests.
		"--allow-privileged=true",
		// Pitfall 3: the kubelet serves on 127.0.0.1 under the node name localhost.
		"--kubelet-preferred-address-types=Hostname",
		"--kubelet-client-certificate=" + kcert, "--kubelet-client-key=" + kkey,
		// The endpoints of the kubernetes Service would be 127.0.0.1, which the API rejects.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
	})
	if err != nil {
		return err
	}
	if c.Kubeconfig, err = c.kubeconfig("admin", "boxcar-test-admin", []string{"system:masters"}); err != nil {
		return err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return fmt.Errorf("cluster: admin kubeconfig: %w", err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("cluster: admin client: %w", err)
	}
	c.client = cs
	return waitFor(ctx, "kube-apiserver /readyz", []*process{p}, func(ctx context.Context) (bool, error) {
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", err
	})
}

// startControllers runs the controller manager (the default ServiceAccount, the
// kube-root-ca.crt ConfigMap, pod garbage collection) and the scheduler. Neither serves:
// readiness is judged by what they do.
func (c *Cluster) startControllers(ctx context.Context) error {
	cm, err := c.kubeconfig("controller-manager", "system:kube-controller-manager", []string{"system:masters"})
	if err != nil {
		return err
	}
	if _, err := c.start("kube-controller-manager", filepath.Join(c.cfg.BinDir, "kube-controller-manager"), []string{
		"--kubeconfig=" + cm,
		"--bind-address=127.0.0.1", "--secure-port=0",
		"--leader-elect=false",
		"--use-service-account-credentials=false",
		"--service-account-private-key-file=" + c.pki.path(saKeyFile),
		"--root-ca-file=" + c.pki.path(caCertFile),
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--profiling=false",
	}); err != nil {
		return err
	}
	sched, err := c.kubeconfig("scheduler", "system:kube-scheduler", []string{"system:masters"})
	if err != nil {
		return err
	}
	_, err = c.start("kube-scheduler", filepath.Join(c.cfg.BinDir, "kube-scheduler"), []string{
		"--kubeconfig=" + sched,
		"--bind-address=127.0.0.1", "--secure-port=0",
		"--leader-elect=false",
		"--profiling=false",
	})
	return err
}

// kubeconfig writes a kubeconfig for a client certificate of cn in groups.
func (c *Cluster) kubeconfig(name, cn string, groups []string) (string, error) {
	return c.kubeconfigAt(c.APIServer, name, cn, groups)
}

// kubeconfigAt is kubeconfig for a client that reaches the API server at server.
func (c *Cluster) kubeconfigAt(server, name, cn string, groups []string) (string, error) {
	cert, key, err := c.pki.issue(name, cn, groups, false)
	if err != nil {
		return "", err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["boxcar-test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: c.pki.path(caCertFile)}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificate: cert, ClientKey: key}
	cfg.Contexts["boxcar-test"] = &clientcmdapi.Context{Cluster: "boxcar-test", AuthInfo: name}
	cfg.CurrentContext = "boxcar-test"
	path := c.path(name + ".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", fmt.Errorf("cluster: write %s: %w", path, err)
	}
	return path, os.Chmod(path, 0o600)
}

func httpOK(ctx context.Context, client *http.Client, url string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, err
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK, nil
}
