package helm

import (
	"net"
	"net/url"
	"strings"
	"testing"
)

// The official NATS chart (github.com/nats-io/k8s) installs, for a release R in namespace N, a
// client Service R (port 4222; the monitoring port is off on it by default) and a headless
// Service R-headless with every enabled port, 8222 included, that names each pod
// R-0.R-headless. KEDA's scaler must read the headless one: it is the only one with 8222, and
// in a NATS cluster the scaler reaches the consumer's leader as <pod>.<endpoint host>.

// TestNATSDefaultsFollowTheNATSChart (issue 12): by default the workers' NATS URL and KEDA's
// monitoring endpoint name the NATS chart's two Services of one release in one namespace, and
// one value moves both.
func TestNATSDefaultsFollowTheNATSChart(t *testing.T) {
	tests := []struct {
		name                  string
		values                string
		wantURL, wantEndpoint string
		wantAccount           string
	}{
		{
			name:         "defaults: release nats in namespace nats",
			wantURL:      "nats://nats.nats.svc.cluster.local:4222",
			wantEndpoint: "nats-headless.nats.svc.cluster.local:8222",
			wantAccount:  "$G",
		},
		{
			name:         "NATS in the release's namespace",
			values:       "natsServer: {service: queue, namespace: ''}",
			wantURL:      "nats://queue." + releaseNamespace + ".svc.cluster.local:4222",
			wantEndpoint: "queue-headless." + releaseNamespace + ".svc.cluster.local:8222",
			wantAccount:  "$G",
		},
		{
			name:         "another namespace, domain, ports and account",
			values:       "natsServer: {namespace: messaging, clusterDomain: k8s.example, port: 4333, monitorPort: 8333, account: BOXCAR}",
			wantURL:      "nats://nats.messaging.svc.k8s.example:4333",
			wantEndpoint: "nats-headless.messaging.svc.k8s.example:8333",
			wantAccount:  "BOXCAR",
		},
		{
			name:         "a headless Service named otherwise",
			values:       "natsServer: {headlessService: nats-mon}",
			wantURL:      "nats://nats.nats.svc.cluster.local:4222",
			wantEndpoint: "nats-mon.nats.svc.cluster.local:8222",
			wantAccount:  "$G",
		},
		{
			name:         "both set explicitly",
			values:       "config: {nats: {url: 'nats://10.0.0.5:4222'}}\nkeda: {enabled: true, natsServerMonitoringEndpoint: '10.0.0.5:8222'}",
			wantURL:      "nats://10.0.0.5:4222",
			wantEndpoint: "10.0.0.5:8222",
			wantAccount:  "$G",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vals := values(t, tt.values)
			if vals["keda"] == nil {
				vals["keda"] = map[string]any{"enabled": true}
			}
			r := render(t, vals)
			cfg := workerConfig(t, r)
			so := all[*scaledObject](r)
			if len(so) != 1 || len(so[0].Spec.Triggers) != 1 {
				t.Fatalf("%d ScaledObjects, want 1 with one trigger", len(so))
			}
			md := so[0].Spec.Triggers[0].Metadata
			if cfg.NATS.URL != tt.wantURL {
				t.Errorf("the workers connect to %s, want %s", cfg.NATS.URL, tt.wantURL)
			}
			if md["natsServerMonitoringEndpoint"] != tt.wantEndpoint {
				t.Errorf("KEDA reads %s, want %s", md["natsServerMonitoringEndpoint"], tt.wantEndpoint)
			}
			if md["account"] != tt.wantAccount {
				t.Errorf("KEDA looks in account %q, want %q", md["account"], tt.wantAccount)
			}
			if !strings.Contains(r.notes, cfg.NATS.URL) || !strings.Contains(r.notes, md["natsServerMonitoringEndpoint"]) {
				t.Errorf("NOTES.txt does not name %s and %s:\n%s", cfg.NATS.URL, md["natsServerMonitoringEndpoint"], r.notes)
			}
		})
	}
}

// natsNamespace is the namespace a Service DNS name points into (svc.namespace.svc.domain),
// or "" for an address that is not one.
func natsNamespace(hostport string) string {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return ""
	}
	parts := strings.Split(host, ".")
	if len(parts) < 3 || parts[2] != "svc" {
		return ""
	}
	return parts[1]
}

// checkNATSNamespaces: the workers and KEDA look for NATS in the same namespace.
func checkNATSNamespaces(t *testing.T, natsURL, endpoint string) {
	t.Helper()
	u, err := url.Parse(natsURL)
	if err != nil {
		t.Fatalf("NATS URL %q: %v", natsURL, err)
	}
	if a, b := natsNamespace(u.Host), natsNamespace(endpoint); a != b {
		t.Errorf("the workers look for NATS in namespace %q (%s), KEDA in %q (%s)", a, natsURL, b, endpoint)
	}
}
