package workercmd

import (
	"bytes"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
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
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	var asked atomic.Int64
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if answer, err := dns64Answer(buf[:n], prefix, &asked); err == nil {
				_, _ = pc.WriteTo(answer, from)
			}
		}
	}()
	return pc.LocalAddr().String(), &asked
}

func dns64Answer(query []byte, prefix netip.Prefix, asked *atomic.Int64) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true})
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	if strings.EqualFold(q.Name.String(), "ipv4only.arpa.") {
		asked.Add(1)
		if q.Type == dnsmessage.TypeAAAA {
			for _, last := range []byte{0xaa, 0xab} { // 192.0.0.170 and .171
				a := prefix.Addr().As16()
				a[12], a[13], a[14], a[15] = 192, 0, 0, last
				rh := dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeAAAA, Class: dnsmessage.ClassINET, TTL: 60}
				if err := b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: a}); err != nil {
					return nil, err
				}
			}
		}
	}
	return b.Finish()
}
