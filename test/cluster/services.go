package cluster

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// CoreDNSVersion is the CoreDNS build.sh builds (test/cluster/coredns).
const CoreDNSVersion = "v1.15.0"

// Ports in the node namespace, which has nothing else listening: fixed numbers cannot clash.
const (
	proxyHealthzPort = 10256
	proxyMetricsPort = 10249
	dnsHealthPort    = 8080
	dnsReadyPort     = 8181
	kubeletHealthz   = 10248
)

// kubeProxyConfig runs kube-proxy in iptables mode in the node namespace. It leaves the
// conntrack sysctls alone (maxPerCore and the timeouts 0): the table size is the host's, and a
// namespace may not change it. NodePorts open on NodeIP only; localhost NodePorts would need
// route_localnet.
const kubeProxyConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {{KUBECONFIG}}
mode: iptables
hostnameOverride: ` + NodeName + `
bindAddress: ` + NodeIP + `
healthzBindAddress: 127.0.0.1:{{HEALTHZ}}
metricsBindAddress: 127.0.0.1:{{METRICS}}
clusterCIDR: ` + BridgeCIDR + `
detectLocalMode: ClusterCIDR
nodePortAddresses: ["` + NodeIP + `/32"]
oomScoreAdj: 0
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  localhostNodePorts: false
  minSyncPeriod: 0s
`

// corefile serves the cluster domain from the API and nothing else: there is no forward
// plugin, so a name outside the cluster gets SERVFAIL and no query leaves the node.
const corefile = `.:53 {
    bind ` + NodeIP + `
    errors
    health 127.0.0.1:{{HEALTH}}
    ready 127.0.0.1:{{READY}}
    kubernetes ` + ClusterDomain + ` in-addr.arpa ip6.arpa {
        kubeconfig {{KUBECONFIG}} boxcar-test
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    cache 5
}
`

// startKubeProxy runs kube-proxy in the node namespace and waits for its first sync.
func (c *Cluster) startKubeProxy(ctx context.Context) error {
	// system:kube-proxy is bound to the system:node-proxier role by default.
	kc, err := c.kubeconfigAt(nodeAPIServer, "kube-proxy", "system:kube-proxy", nil)
	if err != nil {
		return err
	}
	cfg := strings.NewReplacer("{{KUBECONFIG}}", kc, "{{HEALTHZ}}", itoa(proxyHealthzPort), "{{METRICS}}", itoa(proxyMetricsPort)).Replace(kubeProxyConfig)
	cfgPath := c.path("kube-proxy.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return fmt.Errorf("cluster: kube-proxy config: %w", err)
	}
	bin, args := c.inNode(filepath.Join(c.cfg.BinDir, "kube-proxy"), "--config="+cfgPath)
	p, err := c.start("kube-proxy", bin, args)
	if err != nil {
		return err
	}
	return waitFor(ctx, "kube-proxy /healthz", []*process{p}, func(ctx context.Context) (bool, error) {
		return c.nodeHTTPOK(ctx, fmt.Sprintf("http://127.0.0.1:%d/healthz", proxyHealthzPort))
	})
}

// startCoreDNS runs CoreDNS in the node namespace on NodeIP:53, behind the kube-dns Service,
// and waits until its kubernetes plugin has synced.
func (c *Cluster) startCoreDNS(ctx context.Context) error {
	if err := c.createCoreDNSRBAC(ctx); err != nil {
		return err
	}
	kc, err := c.kubeconfigAt(nodeAPIServer, "coredns", "system:coredns", nil)
	if err != nil {
		return err
	}
	cf := strings.NewReplacer("{{KUBECONFIG}}", kc, "{{HEALTH}}", itoa(dnsHealthPort), "{{READY}}", itoa(dnsReadyPort)).Replace(corefile)
	cfPath := c.path("Corefile")
	if err := os.WriteFile(cfPath, []byte(cf), 0o600); err != nil {
		return fmt.Errorf("cluster: Corefile: %w", err)
	}
	bin, args := c.inNode(coreDNSBin(), "-conf", cfPath)
	p, err := c.start("coredns", bin, args)
	if err != nil {
		return err
	}
	return waitFor(ctx, "CoreDNS /ready", []*process{p}, func(ctx context.Context) (bool, error) {
		return c.nodeHTTPOK(ctx, fmt.Sprintf("http://127.0.0.1:%d/ready", dnsReadyPort))
	})
}

func coreDNSBin() string {
	return filepath.Join(CacheDir(), "coredns-"+CoreDNSVersion, "bin", "coredns")
}

// nodeAPIServer is the API server as seen from the node namespace: the relay.
var nodeAPIServer = fmt.Sprintf("https://%s:%d", NodeIP, RelayPort)

// nodeHTTPOK is httpOK from inside the node namespace.
func (c *Cluster) nodeHTTPOK(ctx context.Context, url string) (bool, error) {
	client := &http.Client{Transport: &http.Transport{DialContext: c.dialNode, DisableKeepAlives: true}}
	return httpOK(ctx, client, url)
}

// createClusterServices points the kubernetes Service at the relay (the API server's own
// address, 127.0.0.1, is refused as an endpoint) and makes the kube-dns Service in front of
// CoreDNS. Both are selectorless, with EndpointSlices kube-proxy and CoreDNS read.
func (c *Cluster) createClusterServices(ctx context.Context) error {
	const managedBy = "boxcar-test-cluster"
	slice := func(ns, service string, ports ...discoveryv1.EndpointPort) *discoveryv1.EndpointSlice {
		ready := true
		return &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: service, Namespace: ns, Labels: map[string]string{
				discoveryv1.LabelServiceName: service, discoveryv1.LabelManagedBy: managedBy,
			}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{NodeIP}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
			Ports:       ports,
		}
	}
	port := func(name string, proto corev1.Protocol, n int32) discoveryv1.EndpointPort {
		return discoveryv1.EndpointPort{Name: &name, Protocol: &proto, Port: &n}
	}
	dns := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system", Labels: map[string]string{"k8s-app": "kube-dns"}},
		Spec: corev1.ServiceSpec{ClusterIP: DNSServiceIP, Ports: []corev1.ServicePort{
			{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(53)},
			{Name: "dns-tcp", Protocol: corev1.ProtocolTCP, Port: 53, TargetPort: intstr.FromInt32(53)},
		}},
	}
	if _, err := c.client.CoreV1().Services("kube-system").Create(ctx, dns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("cluster: kube-dns Service: %w", err)
	}
	slices := c.client.DiscoveryV1().EndpointSlices
	for _, s := range []*discoveryv1.EndpointSlice{
		slice("kube-system", "kube-dns", port("dns", corev1.ProtocolUDP, 53), port("dns-tcp", corev1.ProtocolTCP, 53)),
		slice("default", "kubernetes", port("https", corev1.ProtocolTCP, RelayPort)),
	} {
		if _, err := slices(s.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("cluster: EndpointSlice %s/%s: %w", s.Namespace, s.Name, err)
		}
	}
	return nil
}

// createCoreDNSRBAC gives CoreDNS's user what its kubernetes plugin watches.
func (c *Cluster) createCoreDNSRBAC(ctx context.Context) error {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "system:coredns"}},
	}
	rbac := c.client.RbacV1()
	if _, err := rbac.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("cluster: CoreDNS ClusterRole: %w", err)
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("cluster: CoreDNS ClusterRoleBinding: %w", err)
	}
	return nil
}
