package egress

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// TestWorkerEndpointHosts: the hosts of the worker's endpoints are refused on every port, by
// name and by address, unless the profile's allow list names exactly that host and port;
// the endpoint's own port never, and a job's narrowed list cannot lift one. The refusal names
// the entry that would. Before, only the endpoint's own port was refused: with its range
// lifted and a wildcard allowed, the NATS host's monitoring port (8222) was reachable.
func TestWorkerEndpointHosts(t *testing.T) {
	h := setup(t, nil)
	narrowed, err := Narrow(testPolicy(), []string{"nats.files.example.com:6222", "nats.files.example.com:8222", "other.files.example.com:8080"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		policy Policy
		host   string
		port   int
		want   Reason // "" passes
	}{
		{"the NATS endpoint, named exactly", testPolicy(), "nats.files.example.com", 4222, ReasonWorkerEndpoint},
		{"the NATS host's monitoring port, named exactly", testPolicy(), "nats.files.example.com", 8222, ""},
		{"the NATS host's cluster port, under a wildcard", testPolicy(), "nats.files.example.com", 6222, ReasonWorkerEndpoint},
		{"the NATS host's address, an IP literal", Policy{Allow: []string{natsAddr}}, natsAddr, 8222, ReasonWorkerEndpoint},
		{"the NATS host's address and port, named exactly", Policy{Allow: []string{natsAddr + ":8222"}}, natsAddr, 8222, ""},
		{"the store endpoint's address, named exactly", testPolicy(), storeAddr, 9000, ReasonWorkerEndpoint},
		{"the store's address by a name, named exactly", testPolicy(), "mirror.files.example.com", 8080, ""},
		{"the store's address by a name, under a wildcard", testPolicy(), "mirror.files.example.com", 9001, ReasonWorkerEndpoint},
		{"the store's address by another name, under a wildcard", testPolicy(), "other.files.example.com", 8080, ReasonWorkerEndpoint},
		{"a job narrows the wildcard to the NATS host's port", narrowed, "nats.files.example.com", 6222, ReasonWorkerEndpoint},
		{"a job keeps the profile's exact entry", narrowed, "nats.files.example.com", 8222, ""},
		{"a job narrows the wildcard to another name of the store's address", narrowed, "other.files.example.com", 8080, ReasonWorkerEndpoint},
		{"an allowed host of its own", testPolicy(), "a.files.example.com", 8222, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(h.proxy.cfg, tt.policy)
			if err != nil {
				t.Fatal(err)
			}
			hh, err := parseHost(tt.host)
			if err != nil {
				t.Fatal(err)
			}
			_, v := p.checkTarget(t.Context(), hh, tt.port)
			got := Reason("")
			if v != nil {
				got = v.reason
			}
			if got != tt.want {
				t.Fatalf("%s:%d: %v, want %q", tt.host, tt.port, v, tt.want)
			}
			entry := tt.host + ":" + strconv.Itoa(tt.port)
			if v != nil && tt.port != 4222 && tt.port != 9000 && !strings.Contains(v.detail, "name exactly "+entry+" in the profile's network.allow") {
				t.Errorf("the refusal %q does not name the entry that lifts it, %s in network.allow", v.detail, entry)
			}
		})
	}

	// The lifted port carries a request, through the proxy.
	h.dialer.mu.Lock()
	h.dialer.routes[natsAddr+":8222"] = h.dialer.routes[plainAddr+":80"]
	h.dialer.mu.Unlock()
	resp, err := h.client(t).Get("http://nats.files.example.com:8222/varz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || h.plainUp.last(t).URL.Path != "/varz" {
		t.Fatalf("the NATS host's port named exactly: %d, want 200 from the upstream", resp.StatusCode)
	}
}
