//go:build integration

package sandbox_test

import (
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// serveEcho answers every request on ln with its method and request target, as a proxy that
// allows everything would see them.
func serveEcho(t *testing.T, ln net.Listener) {
	t.Helper()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("proxy saw " + r.Method + " " + r.RequestURI))
	})}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
}

// TestBubblewrapEgress: before AttachEgress a sandbox has no network; after it, a command's
// connection to EgressAddr arrives at the listener it returned, the CA is readable at
// EgressCAFile and nowhere writable, and a command's exit status is what it was without the
// bridge in front of it.
func TestBubblewrapEgress(t *testing.T) {
	sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{})
	curl := []string{"curl", "-sS", "--max-time", "20", "--proxy", "http://" + sandbox.EgressAddr, "http://files.example.test/a"}
	if res := run(t, sb, curl...); res.ExitCode == 0 {
		t.Fatalf("curl through %s worked before egress was attached: %s", sandbox.EgressAddr, res.Stdout)
	}
	const ca = "-----BEGIN CERTIFICATE-----\ntest\n-----END CERTIFICATE-----\n"
	ln, err := sb.(sandbox.Egress).AttachEgress(t.Context(), []byte(ca))
	if err != nil {
		t.Fatalf("AttachEgress: %v", err)
	}
	serveEcho(t, ln)
	if _, err := sb.(sandbox.Egress).AttachEgress(t.Context(), []byte(ca)); err == nil {
		t.Error("a second AttachEgress worked; a sandbox has one proxy")
	}
	if res := run(t, sb, curl...); res.ExitCode != 0 || string(res.Stdout) != "proxy saw GET http://files.example.test/a" {
		t.Errorf("curl through the bridge: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if res := run(t, sb, "cat", sandbox.EgressCAFile); string(res.Stdout) != ca {
		t.Errorf("%s holds %q, want the CA given", sandbox.EgressCAFile, res.Stdout)
	}
	if res := run(t, sb, "sh", "-c", "echo x > "+sandbox.EgressCAFile+" || rm -f /run/boxcar/egress/proxy.sock"); res.ExitCode == 0 {
		t.Errorf("a command changed the egress folder: %s", res.Stderr)
	}
	if !strings.Contains(sb.Info().Isolation, "network=loopback+egress") {
		t.Errorf("isolation %q does not say the sandbox has egress", sb.Info().Isolation)
	}
	for _, tt := range []struct {
		name string
		argv []string
		want int
	}{
		{"exit status", []string{"sh", "-c", "exit 7"}, 7},
		{"killed by a signal", []string{"sh", "-c", "kill -9 $$"}, 137},
		{"not found", []string{"no-such-command"}, 127},
		{"not executable", []string{"/etc/passwd"}, 126},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if res := run(t, sb, tt.argv...); res.ExitCode != tt.want {
				t.Errorf("exit %d, want %d (stderr %q)", res.ExitCode, tt.want, res.Stderr)
			}
		})
	}
	// stdin reaches the command through the bridge.
	res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("in")})
	if err != nil || string(res.Stdout) != "in" {
		t.Errorf("cat of stdin through the bridge: %q, %v", res.Stdout, err)
	}
}

// TestBubblewrapEgressConformance runs the egress conformance suite against bubblewrap.
func TestBubblewrapEgressConformance(t *testing.T) {
	sandboxtest.RunEgress(t, sandboxtest.Bubblewrap(t))
}
