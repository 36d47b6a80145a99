package testnet_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/testnet"
)

func TestClosedAddrRefuses(t *testing.T) {
	addr := testnet.ClosedAddr(t)
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("dial %s succeeded, want connection refused", addr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s: %v, want connection refused", addr, err)
	}
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatalf("another listener took %s while the test holds it", addr)
	}
}

func TestListeningAddrReadsBack(t *testing.T) {
	if got, err := testnet.ListeningAddr(os.Getpid()); got != "" || err != nil {
		t.Fatalf("before listening: %q, %v; want nothing", got, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got, err := testnet.ListeningAddr(os.Getpid())
	if err != nil || got != ln.Addr().String() {
		t.Fatalf("ListeningAddr = %q, %v; want %s", got, err, ln.Addr())
	}
}

// TestServeDNSAnswers: the stub answers each name with the addresses of the question's type,
// and a name it has none for with an empty answer.
func TestServeDNSAnswers(t *testing.T) {
	v4, v6 := netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("2001:db8::10")
	var asked atomic.Int64
	addr := testnet.ServeDNS(t, func(name string) []netip.Addr {
		asked.Add(1)
		if name == "api.boxcar.test" {
			return []netip.Addr{v4, v6}
		}
		return nil
	})
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", addr)
	}}
	for _, tt := range []struct {
		network, name string
		want          []netip.Addr
	}{
		{"ip4", "API.boxcar.test.", []netip.Addr{v4}},
		{"ip6", "api.boxcar.test.", []netip.Addr{v6}},
	} {
		got, err := r.LookupNetIP(t.Context(), tt.network, tt.name)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("LookupNetIP(%s, %s) = %v, %v; want %v", tt.network, tt.name, got, err, tt.want)
		}
	}
	if got, err := r.LookupNetIP(t.Context(), "ip4", "other.boxcar.test."); err == nil {
		t.Errorf("a name with no address resolved to %v", got)
	}
	if asked.Load() < 3 {
		t.Errorf("answer saw %d questions, want every one (3 or more)", asked.Load())
	}
}

func TestListeningAddrsReadsEveryFamily(t *testing.T) {
	var want []string
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		want = append(want, ln.Addr().String())
	}
	got, err := testnet.ListeningAddrs(os.Getpid())
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ListeningAddrs = %q, %v; want %q", got, err, want)
	}
}
