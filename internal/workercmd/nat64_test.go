package workercmd

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/boxcar-run/boxcar/internal/testnet"
)

// TestStartWarnsOfUnlistedNAT64: a worker with a networked profile asks its egress resolver
// for ipv4only.arpa at start (RFC 7050) and warns, naming egress.nat64_prefixes, when the
// answer is synthesized under a NAT64 prefix the config does not list; a listed prefix, or a
// worker with no network, says nothing.
func TestStartWarnsOfUnlistedNAT64(t *testing.T) {
	tests := []struct {
		name, network, nat64 string
		asks, warns          bool
	}{
		{"unlisted prefix", `{allow: ["example.com"]}`, "", true, true},
		{"listed prefix", `{allow: ["example.com"]}`, `nat64_prefixes: ["2600:1f00:64::/96"]`, true, false},
		{"no network", "", "", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			resolver, asked := serveDNS64(t, netip.MustParsePrefix("2600:1f00:64::/96"))
			profile := "profiles:\n  p:\n    model: {name: m}\n    tools: [{name: read_file}]\n"
			if tt.network != "" {
				profile += "    network: " + tt.network + "\n"
			}
			cfg := "nats: {url: \"nats://127.0.0.1:1\"}\nstore: {url: \"file://" + filepath.Join(dir, "store") + "\"}\n" +
				"egress: {resolver: \"" + resolver + "\", " + tt.nat64 + "}\n" + profile
			path := filepath.Join(dir, "boxcar.yaml")
			if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			var stderr bytes.Buffer
			w, err := Start(t.Context(), Options{ConfigPath: path, DataDir: dir, MetricsAddr: "off", Getenv: noEnv, Stderr: &stderr})
			if err != nil {
				t.Fatal(err)
			}
			w.Stop()
			_ = w.Wait()
			out := stderr.String()
			warned := strings.Contains(out, `"prefix":"2600:1f00:64::/96","setting":"egress.nat64_prefixes"`)
			if warned != tt.warns || (asked.Load() > 0) != tt.asks {
				t.Errorf("asked ipv4only.arpa %d times, warned %v, want asked %v, warned %v; log:\n%s", asked.Load(), warned, tt.asks, tt.warns, out)
			}
		})
	}
}

// serveDNS64 answers AAAA queries for ipv4only.arpa as a DNS64 under prefix (a /96) would, and
// every other query with no answer, on a UDP port of loopback; it returns the address and the
// count of ipv4only.arpa queries.
func serveDNS64(t *testing.T, prefix netip.Prefix) (string, *atomic.Int64) {
	t.Helper()
	var asked atomic.Int64
	addr := testnet.ServeDNS(t, func(name string) []netip.Addr {
		if name != "ipv4only.arpa" {
			return nil
		}
		asked.Add(1)
		var out []netip.Addr
		for _, last := range []byte{0xaa, 0xab} { // 192.0.0.170 and .171
			a := prefix.Addr().As16()
			a[12], a[13], a[14], a[15] = 192, 0, 0, last
			out = append(out, netip.AddrFrom16(a))
		}
		return out
	})
	return addr, &asked
}
