package helm

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// dst is a destination of the workers' egress on TCP: an address outside the cluster's pods,
// or the pods of a namespace ("ns:<name>", "ns:*" for a namespace none of the rules names).
type dst struct {
	to   string
	port int
}

func (d dst) reachedBy(t *testing.T, np *networkingv1.NetworkPolicy) bool {
	return egressReaches(t, np, d)
}

func (d dst) String() string { return fmt.Sprintf("%s on TCP/%d", d.to, d.port) }

// udst is an address of the workers' egress on a protocol of its own.
type udst struct {
	to    string
	proto corev1.Protocol
	port  int
}

func (d udst) reachedBy(t *testing.T, np *networkingv1.NetworkPolicy) bool {
	return egressAllows(t, np, d.to, d.proto, d.port)
}

func (d udst) String() string { return fmt.Sprintf("%s on %s/%d", d.to, d.proto, d.port) }

// checkEgress: np lets its pods reach each of reach and none of stop.
func checkEgress[D interface {
	reachedBy(*testing.T, *networkingv1.NetworkPolicy) bool
	fmt.Stringer
}](t *testing.T, np *networkingv1.NetworkPolicy, reach, stop []D) {
	t.Helper()
	for _, d := range reach {
		if !d.reachedBy(t, np) {
			t.Errorf("the workers cannot reach %s", d)
		}
	}
	for _, d := range stop {
		if d.reachedBy(t, np) {
			t.Errorf("the workers may reach %s", d)
		}
	}
}

// TestWorkerEgressToEndpointsOnlyWhereTheyAre: the workers' NetworkPolicy rules for the store,
// the model and NATS, with their "to" empty, let the worker pods reach each endpoint's port
// only where the endpoint may be: an IP literal's own address (a /32 or /128), a Service name's
// namespace, and for another host name any address but those nothing legitimate is (link-local
// with cloud metadata, and what the sandboxes' rule leaves out), narrowed further by
// networkPolicy.exceptCIDRs, or the cluster's pods. They opened the port to every address: a
// store or a model on port 80 opened 169.254.169.254:80 to the pods that hold the model's key
// and the store's; and NATS's rule opened only the first port of a comma-separated
// config.nats.url, to natsServer's namespace whatever the URL named.
func TestWorkerEgressToEndpointsOnlyWhereTheyAre(t *testing.T) {
	for _, tt := range []struct {
		name        string
		values      string
		reach, stop []dst
	}{
		{
			name:   "store and model by host name on port 80",
			values: "config: {store: {endpoint: 'http://minio.example:80'}, model: {base_url: 'http://llm.example/v1'}}",
			reach:  []dst{{"203.0.113.7", 80}, {"10.1.2.3", 80}, {"2001:db8::7", 80}, {"ns:*", 80}, {"64:ff9b::cb00:7107", 80}},
			stop: []dst{{"169.254.169.254", 80}, {"169.254.1.1", 80}, {"fd00:ec2::254", 80}, {"fe80::1", 80}, {"100.100.100.200", 80}, {"168.63.129.16", 80},
				// The same through a NAT64 gateway (64:ff9b::/96), which dials the IPv4 address.
				{"64:ff9b::a9fe:a9fe", 80}, {"64:ff9b::6464:64c8", 80}, {"64:ff9b::a83f:8110", 80}, {"64:ff9b::7f00:1", 80}, {"64:ff9b::e000:fb", 80}},
		},
		{
			name:   "model at an IPv4 literal, store at an IPv6 one",
			values: "config: {store: {endpoint: 'http://[2001:db8::5]:7070'}, model: {base_url: 'http://10.20.30.40:8000/v1'}}",
			reach:  []dst{{"10.20.30.40", 8000}, {"2001:db8::5", 7070}},
			stop:   []dst{{"10.20.30.41", 8000}, {"169.254.169.254", 8000}, {"2001:db8::6", 7070}, {"ns:*", 8000}, {"ns:*", 7070}},
		},
		{
			name:   "store in the cluster by its Service name",
			values: "config: {store: {endpoint: 'http://versitygw.storage.svc:7070'}}",
			reach:  []dst{{"ns:storage", 7070}},
			stop:   []dst{{"203.0.113.7", 7070}, {"169.254.169.254", 7070}, {"ns:*", 7070}},
		},
		{
			name:   "NATS, a list of IP literals on two ports",
			values: "config: {nats: {url: 'nats://10.0.0.5:4222,nats://10.0.0.6:4223'}}",
			reach:  []dst{{"10.0.0.5", 4222}, {"10.0.0.6", 4223}},
			stop:   []dst{{"10.0.0.7", 4222}, {"169.254.169.254", 4222}, {"169.254.169.254", 4223}},
		},
		{
			name:   "NATS, a list of host names, one without a scheme",
			values: "config: {nats: {url: 'nats://a.nats.example:4222, b.nats.example:5222'}}",
			reach:  []dst{{"203.0.113.7", 4222}, {"203.0.113.7", 5222}, {"ns:*", 5222}},
			stop:   []dst{{"169.254.169.254", 4222}, {"169.254.169.254", 5222}},
		},
		{
			name:  "NATS of natsServer: its namespace's pods alone",
			reach: []dst{{"ns:nats", 4222}},
			stop:  []dst{{"203.0.113.7", 4222}, {"ns:*", 4222}},
		},
		{
			name:   "exceptCIDRs narrows the host names' rules and the sandboxes'",
			values: "networkPolicy: {exceptCIDRs: ['10.0.0.0/8', 'fd12::/16']}\n" + networkedProfile("['files.example.com:80']") + "\n  store: {endpoint: 'http://minio.example:9000'}",
			reach:  []dst{{"203.0.113.7", 9000}, {"203.0.113.7", 80}, {"2001:db8::7", 9000}},
			stop:   []dst{{"10.1.2.3", 9000}, {"10.1.2.3", 80}, {"fd12::1", 9000}, {"169.254.169.254", 9000}, {"64:ff9b::a01:203", 9000}, {"64:ff9b::a01:203", 80}},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			checkEgress(t, workerPolicy(t, render(t, values(t, tt.values))), tt.reach, tt.stop)
		})
	}
}

// egressReaches: np lets its pods reach d on TCP, an address through egressAllows, a
// namespace's pods through a rule on that port whose peers select them by the namespace's
// name label, or, for "ns:*", select every namespace's (an empty namespace selector, or none).
func egressReaches(t *testing.T, np *networkingv1.NetworkPolicy, d dst) bool {
	t.Helper()
	ns, isNS := cutPrefix(d.to, "ns:")
	if !isNS {
		return egressAllows(t, np, d.to, corev1.ProtocolTCP, d.port)
	}
	for _, rule := range np.Spec.Egress {
		if !slices.ContainsFunc(rule.Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port.IntValue() == d.port }) && len(rule.Ports) > 0 {
			continue
		}
		if len(rule.To) == 0 {
			return true
		}
		for _, p := range rule.To {
			if p.NamespaceSelector == nil || p.PodSelector != nil && len(p.PodSelector.MatchLabels)+len(p.PodSelector.MatchExpressions) > 0 {
				continue
			}
			sel := p.NamespaceSelector
			if len(sel.MatchLabels)+len(sel.MatchExpressions) == 0 {
				return true
			}
			if ns != "*" && len(sel.MatchExpressions) == 0 && len(sel.MatchLabels) == 1 && sel.MatchLabels["kubernetes.io/metadata.name"] == ns {
				return true
			}
		}
	}
	return false
}

func cutPrefix(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && s[:len(prefix)] == prefix {
		return s[len(prefix):], true
	}
	return s, false
}

// TestNetworkPolicyAddressesAreCIDRs: every value the chart puts in a NetworkPolicy's ipBlock
// (networkPolicy.exceptCIDRs, each "to" peer's cidr and except, metricsFrom's) and the worker
// config's CIDR keys are refused at install, naming the value, unless the API server and the
// worker would take them; what is taken renders ipBlocks the API server accepts. The schema
// took any "digits/digits" for exceptCIDRs and any object for an ipBlock, so 10.0.0.0/33, a
// 0.0.0.0/0 (no strict part of the rule's 0.0.0.0/0) or an ipBlock without a cidr installed a
// chart whose NetworkPolicy the API server refused, and the config's keys took anything.
func TestNetworkPolicyAddressesAreCIDRs(t *testing.T) {
	const apiExcept = "/networkPolicy/apiServer/to/0/ipBlock/except/0"
	places := []struct{ path, values string }{
		{"/networkPolicy/exceptCIDRs/0", "networkPolicy: {exceptCIDRs: ['%s']}"},
		{"/networkPolicy/store/to/0/ipBlock/cidr", "networkPolicy: {store: {to: [{ipBlock: {cidr: '%s'}}]}}"},
		{apiExcept, "networkPolicy: {apiServer: {to: [{ipBlock: {cidr: '10.0.0.0/8', except: ['%s']}}]}}"},
		{"/networkPolicy/metricsFrom/0/ipBlock/cidr", "networkPolicy: {metricsFrom: [{ipBlock: {cidr: '%s'}}]}"},
		{"/networkPolicy/extraEgress/0/to/0/ipBlock/cidr", "networkPolicy: {extraEgress: [{to: [{ipBlock: {cidr: '%s'}}]}]}"},
		{"/config/egress/allowed_cidrs/0", "config: {egress: {allowed_cidrs: ['%s']}}"},
		{"/config/egress/denied_cidrs/0", "config: {egress: {denied_cidrs: ['%s']}}"},
	}
	for _, tt := range []struct {
		cidr string
		ok   bool
		// refusedAt are the places that refuse a CIDR the others take, by the words of their refusal.
		refusedAt map[string]string
	}{
		{cidr: "10.20.0.0/16", ok: true},
		{cidr: "fd00::/8", ok: true, refusedAt: map[string]string{apiExcept: "not strictly inside"}},
		{cidr: "0.0.0.0/0", ok: true, refusedAt: map[string]string{
			"/networkPolicy/exceptCIDRs/0": `networkPolicy.exceptCIDRs[0] is "0.0.0.0/0"`,
			apiExcept:                      "not strictly inside",
		}},
		{cidr: "::/0", ok: true, refusedAt: map[string]string{
			"/networkPolicy/exceptCIDRs/0": `networkPolicy.exceptCIDRs[0] is "::/0"`,
			apiExcept:                      "not strictly inside",
		}},
		// IPv4 written as IPv6: the worker reads it, the API server's except check does not
		// (IPv4 to it, outside ::/0).
		{cidr: "::ffff:10.0.0.0/104", ok: true, refusedAt: map[string]string{
			"/networkPolicy/exceptCIDRs/0":                   "IPv4 part",
			"/networkPolicy/store/to/0/ipBlock/cidr":         "IPv4 part",
			apiExcept:                                        "IPv4 part",
			"/networkPolicy/metricsFrom/0/ipBlock/cidr":      "IPv4 part",
			"/networkPolicy/extraEgress/0/to/0/ipBlock/cidr": "IPv4 part",
		}},
		// The same, its IPv4 part in hex: the same bytes to the API server and the CNIs.
		{cidr: "::ffff:a00:0/104", ok: true, refusedAt: map[string]string{
			"/networkPolicy/exceptCIDRs/0":                   "IPv4-mapped",
			"/networkPolicy/store/to/0/ipBlock/cidr":         "IPv4-mapped",
			apiExcept:                                        "IPv4-mapped",
			"/networkPolicy/metricsFrom/0/ipBlock/cidr":      "IPv4-mapped",
			"/networkPolicy/extraEgress/0/to/0/ipBlock/cidr": "IPv4-mapped",
		}},
		// An IPv6 range in hex that is no IPv4 address (NAT64) is IPv6 to all of them.
		{cidr: "64:ff9b::a00:0/120", ok: true, refusedAt: map[string]string{apiExcept: "not strictly inside"}},
		{cidr: "10.0.0.0/33"},
		{cidr: "fd00::/129"},
		{cidr: "nodes"},
		{cidr: "10.0.0.1"},
		{cidr: "256.1.0.0/16"},
		{cidr: "10.0.0.0/08"},
		{cidr: ""},
	} {
		for _, pl := range places {
			t.Run(tt.cidr+" at "+pl.path, func(t *testing.T) {
				r, err := tryRender(t, withSigningKey(values(t, fmt.Sprintf(pl.values, tt.cidr))))
				words, refused := tt.refusedAt[pl.path]
				switch {
				case tt.ok && !refused && err != nil:
					t.Fatalf("refused: %v", err)
				case tt.ok && !refused:
					checkIPBlocks(t, r)
				case err == nil:
					t.Fatal("taken; want it refused")
				case refused && !strings.Contains(err.Error(), words):
					t.Errorf("refused with %v; want it to say %q", err, words)
				case !refused && !strings.Contains(err.Error(), fmt.Sprintf("at '%s': '%s'", pl.path, tt.cidr)):
					t.Errorf("refused with %v; want it to name %s and the value", err, pl.path)
				}
			})
		}
	}
}

// checkIPBlocks holds every ipBlock of r's NetworkPolicies to the API server's rules
// (ValidateIPBlock): a cidr, each except a prefix strictly inside it.
func checkIPBlocks(t *testing.T, r *rendered) {
	t.Helper()
	for _, np := range all[*networkingv1.NetworkPolicy](r) {
		var peers []networkingv1.NetworkPolicyPeer
		for _, rule := range np.Spec.Egress {
			peers = append(peers, rule.To...)
		}
		for _, rule := range np.Spec.Ingress {
			peers = append(peers, rule.From...)
		}
		for _, p := range peers {
			if p.IPBlock == nil {
				continue
			}
			// net.IPNet's Contains, as the API server's: an IPv4-mapped IPv6 address is IPv4 to it,
			// and so outside ::/0.
			_, cidr, err := net.ParseCIDR(p.IPBlock.CIDR)
			if err != nil {
				t.Errorf("NetworkPolicy %s: ipBlock.cidr %q: %v", np.Name, p.IPBlock.CIDR, err)
				continue
			}
			cidrBits, _ := cidr.Mask.Size()
			for _, e := range p.IPBlock.Except {
				// The chart's own excepts (the NAT64 forms it derives) as Go writes them: the API
				// server's stricter validation warns of another form.
				if pr, err := netip.ParsePrefix(e); err == nil && pr.Masked().String() != e {
					t.Errorf("NetworkPolicy %s: except %q is written %q in canonical form", np.Name, e, pr.Masked())
				}
				_, ex, err := net.ParseCIDR(e)
				if err == nil {
					if exBits, _ := ex.Mask.Size(); exBits > cidrBits && cidr.Contains(ex.IP) {
						continue
					}
				}
				t.Errorf("NetworkPolicy %s: ipBlock %s except %q: the API server refuses an except not strictly inside the cidr", np.Name, cidr, e)
			}
		}
	}
}

// TestResolverAndAPIServerRulesOpenOnlyTheirPeers: the workers' NetworkPolicy rules for the
// egress proxy's resolver (config.egress.resolver) and the API server open their ports only
// where these may be: the resolver's IP literal alone (a link-local node cache's too), a host
// name's addresses as the store's are; the API server, whose address the chart cannot know,
// any address but those nothing legitimate is (and not exceptCIDRs, which often hold the nodes'
// network, its home), unless apiServer.to names it. Both rules opened their ports to every
// address: the resolver's UDP/53 and the API server's 443 reached 169.254.169.254.
func TestResolverAndAPIServerRulesOpenOnlyTheirPeers(t *testing.T) {
	const withProfile = "['files.example.com:8443']"
	for _, tt := range []struct {
		name        string
		values      string
		reach, stop []udst
	}{
		{
			name:   "resolver at an IPv4 literal",
			values: networkedProfile(withProfile) + "\n  egress: {resolver: '10.0.0.10:53'}",
			reach:  []udst{{"10.0.0.10", corev1.ProtocolUDP, 53}, {"10.0.0.10", corev1.ProtocolTCP, 53}},
			stop:   []udst{{"10.0.0.11", corev1.ProtocolUDP, 53}, {"169.254.169.254", corev1.ProtocolUDP, 53}, {"169.254.169.254", corev1.ProtocolTCP, 53}, {"203.0.113.7", corev1.ProtocolUDP, 53}},
		},
		{
			name:   "resolver a node's link-local cache",
			values: networkedProfile(withProfile) + "\n  egress: {resolver: '169.254.20.10:53'}",
			reach:  []udst{{"169.254.20.10", corev1.ProtocolUDP, 53}},
			stop:   []udst{{"169.254.169.254", corev1.ProtocolUDP, 53}},
		},
		{
			name:   "resolver at an IPv6 literal",
			values: networkedProfile(withProfile) + "\n  egress: {resolver: '[fd00::53]:5353'}",
			reach:  []udst{{"fd00::53", corev1.ProtocolUDP, 5353}, {"fd00::53", corev1.ProtocolTCP, 5353}},
			stop:   []udst{{"fd00::54", corev1.ProtocolUDP, 5353}, {"fd00:ec2::254", corev1.ProtocolUDP, 5353}},
		},
		{
			name:   "resolver by host name",
			values: "networkPolicy: {exceptCIDRs: ['10.0.0.0/8']}\n" + networkedProfile(withProfile) + "\n  egress: {resolver: 'dns.corp.example:5353'}",
			reach:  []udst{{"203.0.113.7", corev1.ProtocolUDP, 5353}, {"203.0.113.7", corev1.ProtocolTCP, 5353}},
			stop:   []udst{{"169.254.169.254", corev1.ProtocolUDP, 5353}, {"127.0.0.1", corev1.ProtocolUDP, 5353}, {"10.1.2.3", corev1.ProtocolUDP, 5353}, {"64:ff9b::a9fe:a9fe", corev1.ProtocolUDP, 5353}, {"64:ff9b::a01:203", corev1.ProtocolUDP, 5353}},
		},
		{
			name:   "API server by default",
			values: "networkPolicy: {exceptCIDRs: ['10.0.0.0/8']}",
			reach:  []udst{{"203.0.113.7", corev1.ProtocolTCP, 443}, {"10.0.0.1", corev1.ProtocolTCP, 6443}, {"2001:db8::1", corev1.ProtocolTCP, 443}},
			stop:   []udst{{"169.254.169.254", corev1.ProtocolTCP, 443}, {"127.0.0.1", corev1.ProtocolTCP, 6443}, {"fd00:ec2::254", corev1.ProtocolTCP, 443}, {"224.0.0.1", corev1.ProtocolTCP, 443}, {"64:ff9b::a9fe:a9fe", corev1.ProtocolTCP, 443}, {"64:ff9b::ffff:ffff", corev1.ProtocolTCP, 443}},
		},
		{
			name:   "API server named by apiServer.to",
			values: "networkPolicy: {apiServer: {to: [{ipBlock: {cidr: '172.20.0.10/32'}}]}}",
			reach:  []udst{{"172.20.0.10", corev1.ProtocolTCP, 6443}},
			stop:   []udst{{"172.20.0.11", corev1.ProtocolTCP, 6443}, {"203.0.113.7", corev1.ProtocolTCP, 6443}},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			checkEgress(t, workerPolicy(t, render(t, values(t, tt.values))), tt.reach, tt.stop)
		})
	}
}

// TestSandboxEgressIsTCPAlone: the rule for the sandboxes' destinations opens TCP alone, which
// is all the egress proxy dials for them (the resolver has its own rule); for a network.allow
// entry naming no port it opened every port of every protocol, UDP and SCTP to any address
// among them, where it says every port.
func TestSandboxEgressIsTCPAlone(t *testing.T) {
	np := workerPolicy(t, render(t, values(t, networkedProfile("['api.example.com']"))))
	if !egressAllows(t, np, "203.0.113.7", corev1.ProtocolTCP, 8443) {
		t.Error("the workers cannot reach 203.0.113.7 on TCP/8443, which network.allow lets the proxy dial")
	}
	for _, proto := range []corev1.Protocol{corev1.ProtocolUDP, corev1.ProtocolSCTP} {
		if egressAllows(t, np, "203.0.113.7", proto, 123) {
			t.Errorf("the workers may reach 203.0.113.7 on %s/123", proto)
		}
	}
}

// TestServiceNameRuleOnlyForInClusterNames: an endpoint's host name is taken for a Service's
// (its rule then reaches that namespace's pods alone) only when it is one in the cluster:
// <service>.<namespace>.svc, or <pod>.<service>.<namespace>.svc, either under the cluster's
// domain (natsServer.clusterDomain) or with none, in any case; any other name, one ending in
// .svc under another domain among them, takes the rule of a host name anywhere (the cluster's
// pods, or any address but link-local, loopback and multicast). A name with ".svc." under an
// outside domain took the Service rule, to the namespace named by its second label, so the
// workers' NetworkPolicy blocked a store at store.svc.example.com with no word of why.
func TestServiceNameRuleOnlyForInClusterNames(t *testing.T) {
	places := []struct{ name, values string }{
		{"store", "config: {store: {endpoint: 'http://%s:7070'}}"},
		{"model", "config: {model: {base_url: 'http://%s:7070/v1'}}"},
		{"nats", "config: {nats: {url: 'nats://%s:7070'}}"},
		{"resolver", "config: {egress: {resolver: '%s:7070'}}"},
	}
	for _, tt := range []struct {
		host, clusterDomain string
		ns                  string // the Service's namespace; "" for a host name anywhere
	}{
		{host: "versitygw.storage.svc", ns: "storage"},
		{host: "versitygw.storage.svc.cluster.local", ns: "storage"},
		{host: "versitygw.storage.svc.cluster.local.", ns: "storage"},
		{host: "VersityGW.Storage.SVC.Cluster.Local", ns: "storage"},
		{host: "minio-0.minio-hl.storage.svc.cluster.local", ns: "storage"},
		{host: "minio-0.minio-hl.storage.svc", ns: "storage"},
		{host: "gw.store-1.svc.k8s.example", clusterDomain: "k8s.example", ns: "store-1"},
		{host: "store.svc.example.com"},
		{host: "a.b.svc.example.com"},
		{host: "a.b.svc.cluster.local.example.com"},
		{host: "a.b.svc.cluster.localhost"},
		{host: "a.b.svc.cluster.local", clusterDomain: "k8s.example"},
		{host: "a.b.svc.k8s.example"},
		{host: "a.b.svc."},
		{host: "x.svc"},
		{host: "svc.example.com"},
		{host: "a.b.c.d.svc.cluster.local"},
		{host: "a_b.c.svc"},
		{host: "a.-c.svc"},
		// A name two labels long may be a Service's (minio.storage, through the pods' search
		// domains) or a public one (example.com): the rule of a host name anywhere reaches both.
		{host: "minio.storage"},
		{host: "example.com"},
	} {
		for _, pl := range places {
			t.Run(tt.host+" "+tt.clusterDomain+" as "+pl.name, func(t *testing.T) {
				doc := fmt.Sprintf(pl.values, tt.host)
				if tt.clusterDomain != "" {
					doc += "\nnatsServer: {clusterDomain: " + tt.clusterDomain + "}"
				}
				np := workerPolicy(t, render(t, values(t, doc)))
				reach, stop := []dst{{"203.0.113.7", 7070}, {"ns:*", 7070}}, []dst{{"169.254.169.254", 7070}, {"127.0.0.1", 7070}}
				if tt.ns != "" {
					reach, stop = []dst{{"ns:" + tt.ns, 7070}}, append(stop, reach...)
				}
				for _, d := range reach {
					if !egressReaches(t, np, d) {
						t.Errorf("the workers cannot reach %s on TCP/%d", d.to, d.port)
					}
				}
				for _, d := range stop {
					if egressReaches(t, np, d) {
						t.Errorf("the workers may reach %s on TCP/%d", d.to, d.port)
					}
				}
			})
		}
	}
}

// TestEndpointRuleAsTheClientReadsIt: an endpoint's rule is on the port and at the address the
// worker's client dials: a scheme in capitals is the scheme (Go's URL parser lowers it, and the
// default port is the scheme's), and an IPv4 address written as IPv6 (::ffff:10.0.0.1) is the
// IPv4 one the packets go to, in hex too (::ffff:a00:1), and a port's leading zeros are
// nothing (Go dials 010 as 10). NATS://host and HTTP://host opened port 443, where the clients
// dial 4222 and 80, [::ffff:10.0.0.1] and [::ffff:a00:1] an ipBlock no IPv4 packet matches,
// and :010 port 8 (octal), :08000 port 0: the workers could not reach the endpoint.
func TestEndpointRuleAsTheClientReadsIt(t *testing.T) {
	for _, tt := range []struct {
		values      string
		reach, stop []dst
	}{
		{values: "config: {store: {endpoint: 'HTTP://minio.example'}}", reach: []dst{{"203.0.113.7", 80}}},
		{values: "config: {model: {base_url: 'Http://llm.example/v1'}}", reach: []dst{{"203.0.113.7", 80}}},
		{values: "config: {nats: {url: 'NATS://nats.example'}}", reach: []dst{{"203.0.113.7", 4222}}},
		{values: "config: {nats: {url: 'TLS://nats.example, WS://nats2.example'}}", reach: []dst{{"203.0.113.7", 4222}, {"203.0.113.7", 80}}},
		{values: "config: {model: {base_url: 'http://[::ffff:10.0.0.1]:8000/v1'}}", reach: []dst{{"10.0.0.1", 8000}}, stop: []dst{{"10.0.0.2", 8000}}},
		{values: "config: {store: {endpoint: 'http://[::FFFF:10.0.0.1]:7070'}}", reach: []dst{{"10.0.0.1", 7070}}, stop: []dst{{"10.0.0.2", 7070}}},
		{values: "config: {store: {endpoint: 'http://[0:0:0:0:0:ffff:10.0.0.1]:7070'}}", reach: []dst{{"10.0.0.1", 7070}}, stop: []dst{{"10.0.0.2", 7070}}},
		// The same address with its IPv4 part in hex, as Go reads it too (net.ParseIP("::ffff:a00:1").To4()).
		{values: "config: {store: {endpoint: 'http://[::ffff:a00:1]:7070'}}", reach: []dst{{"10.0.0.1", 7070}}, stop: []dst{{"10.0.0.2", 7070}}},
		{values: "config: {model: {base_url: 'http://[0:0:0:0:0:FFFF:0A00:0001]:8000/v1'}}", reach: []dst{{"10.0.0.1", 8000}}, stop: []dst{{"10.0.0.2", 8000}}},
		{values: "config: {nats: {url: 'nats://[::ffff:c0a8:102]'}}", reach: []dst{{"192.168.1.2", 4222}}, stop: []dst{{"192.168.1.3", 4222}}},
		// A port with leading zeros is the decimal one to Go (net.Dial's port "010" is 10), not octal.
		{values: "config: {store: {endpoint: 'http://minio.example:010'}}", reach: []dst{{"203.0.113.7", 10}}},
		{values: "config: {model: {base_url: 'http://10.0.0.1:08000/v1'}}", reach: []dst{{"10.0.0.1", 8000}}},
		{values: "config: {egress: {resolver: '10.0.0.10:053'}}", reach: []dst{{"10.0.0.10", 53}}},
		{values: networkedProfile("['api.example.com:08443']"), reach: []dst{{"203.0.113.7", 8443}}},
	} {
		t.Run(tt.values, func(t *testing.T) {
			checkEgress(t, workerPolicy(t, render(t, values(t, tt.values))), tt.reach, tt.stop)
		})
	}
}
