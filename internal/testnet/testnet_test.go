package testnet_test

import (
	"errors"
	"net"
	"os"
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
