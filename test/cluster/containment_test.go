package cluster_test

import (
	"bytes"
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
	"github.com/boxcar-run/boxcar/test/cluster"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestContainment looks at a sandbox pod from inside: the network it has, the credentials it
// does not have, and what is left of a command after its timeout.
func TestContainment(t *testing.T) {
	ns := sandboxNamespace(t)
	p := newProvider(t, ns, "containment")
	sb := sandboxtest.Start(t, p)
	ctx := t.Context()
	pod, err := kube.Client.CoreV1().Pods(ns).Get(ctx, sb.Info().ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cat := func(t *testing.T, path string) string {
		t.Helper()
		return string(sandboxtest.Sh(t, sb, "cat "+path).Stdout)
	}

	t.Run("no IPv4 route", func(t *testing.T) {
		// The main routing table: a header line and nothing else.
		lines := strings.Split(strings.TrimSpace(cat(t, "/proc/net/route")), "\n")
		if len(lines) != 1 {
			t.Errorf("/proc/net/route has routes:\n%s", strings.Join(lines, "\n"))
		}
	})
	t.Run("no IPv6 route but loopback", func(t *testing.T) {
		for _, l := range strings.Split(strings.TrimSpace(cat(t, "/proc/net/ipv6_route")), "\n") {
			if f := strings.Fields(l); len(f) > 0 && f[len(f)-1] != "lo" {
				t.Errorf("IPv6 route off loopback: %s", l)
			}
		}
		for _, l := range strings.Split(strings.TrimSpace(cat(t, "/proc/net/if_inet6")), "\n") {
			if f := strings.Fields(l); len(f) > 0 && f[len(f)-1] != "lo" {
				t.Errorf("IPv6 address off loopback: %s", l)
			}
		}
	})
	t.Run("only the CNI address", func(t *testing.T) {
		// fib_trie's local table lists every address the pod has ("/32 host LOCAL").
		local := localAddresses(cat(t, "/proc/net/fib_trie"))
		for _, a := range local {
			if a != pod.Status.PodIP && !strings.HasPrefix(a, "127.") {
				t.Errorf("pod has address %s; the CNI gave only %s", a, pod.Status.PodIP)
			}
		}
		if _, isolated, _ := net.ParseCIDR(cluster.IsolatedCIDR); !isolated.Contains(net.ParseIP(pod.Status.PodIP)) {
			t.Errorf("pod IP = %q, want one in %s, the sandbox pods' range", pod.Status.PodIP, cluster.IsolatedCIDR)
		}
	})
	t.Run("host loopback unreachable", func(t *testing.T) {
		// The API server listens on the host's 127.0.0.1; the pod's 127.0.0.1 is its own.
		u, err := url.Parse(kube.APIServer)
		if err != nil {
			t.Fatal(err)
		}
		res := sandboxtest.Exec(t, sb, sandbox.ExecRequest{Argv: []string{"nc", "-w", "2", "127.0.0.1", u.Port()}, Timeout: 20 * time.Second})
		if res.ExitCode == 0 || !bytes.Contains(res.Stderr, []byte("refused")) {
			t.Errorf("nc 127.0.0.1:%s from the pod: exit %d, stderr %q; want connection refused", u.Port(), res.ExitCode, res.Stderr)
		}
	})
	t.Run("cluster DNS and Services unreachable", func(t *testing.T) {
		// Other pods have CoreDNS and the Services; a sandbox pod has no route to either.
		res := sandboxtest.Exec(t, sb, sandbox.ExecRequest{Argv: []string{"nc", "-w", "2", cluster.DNSServiceIP, "53"}, Timeout: 20 * time.Second})
		if res.ExitCode == 0 || !bytes.Contains(res.Stderr, []byte("unreachable")) {
			t.Errorf("nc %s 53 from the pod: exit %d, stderr %q; want network unreachable", cluster.DNSServiceIP, res.ExitCode, res.Stderr)
		}
	})
	t.Run("no service-account token", func(t *testing.T) {
		if m := cat(t, "/proc/mounts"); strings.Contains(m, "serviceaccount") || strings.Contains(m, "secrets") {
			t.Errorf("a secret or token is mounted:\n%s", m)
		}
		res := sandboxtest.Exec(t, sb, sandbox.ExecRequest{Argv: []string{"ls", "/var/run/secrets/kubernetes.io/serviceaccount"}, Timeout: 20 * time.Second})
		if res.ExitCode == 0 {
			t.Errorf("the service-account folder exists: %s", res.Stdout)
		}
		if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
			t.Error("pod spec automounts the service-account token")
		}
	})
	t.Run("unprivileged", func(t *testing.T) {
		if id := strings.TrimSpace(string(sandboxtest.Sh(t, sb, "id -u").Stdout)); id != "1000" {
			t.Errorf("uid = %s, want 1000", id)
		}
		status := cat(t, "/proc/self/status")
		for _, capLine := range []string{"CapEff:\t0000000000000000", "CapPrm:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"} {
			if !strings.Contains(status, capLine) {
				t.Errorf("/proc/self/status lacks %q", capLine)
			}
		}
		res := sandboxtest.Exec(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo x > /x"}, Timeout: 20 * time.Second})
		if res.ExitCode == 0 {
			t.Error("wrote to the root filesystem, want it read-only")
		}
	})
	t.Run("timeout kills the tree in the pod", func(t *testing.T) {
		// Children that ignore SIGTERM and outlive their parent's shell.
		mark := strconv.Itoa(3000 + int(time.Now().UnixNano()%900))
		start := time.Now()
		res := sandboxtest.Exec(t, sb, sandbox.ExecRequest{
			Argv:    []string{"sh", "-c", "trap '' TERM; (trap '' TERM; sleep " + mark + ") & sleep " + mark + " & sleep " + mark + "; wait"},
			Timeout: time.Second,
		})
		if !res.TimedOut {
			t.Fatalf("TimedOut = false (exit %d), want true", res.ExitCode)
		}
		t.Logf("timed out after %s", time.Since(start).Round(time.Millisecond))
		// From inside the pod: no process left with the mark.
		// Whole command lines only: this check's own shell has the mark in its script.
		left := sandboxtest.Sh(t, sb, `for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < "$f" 2>/dev/null; echo; done | grep -c -x "sleep `+mark+` " || true`)
		if n := strings.TrimSpace(string(left.Stdout)); n != "0" {
			t.Errorf("%s processes with the mark still run in the pod", n)
		}
		// From the host, which sees every container process: none either.
		if pids := hostProcesses("sleep\x00" + mark + "\x00"); len(pids) > 0 {
			t.Errorf("host sees the command's processes %v still running", pids)
		}
	})
	t.Run("context cancel kills in the pod", func(t *testing.T) {
		mark := strconv.Itoa(4000 + int(time.Now().UnixNano()%900))
		cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		_, err := sb.Exec(cctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "sleep " + mark + " & sleep " + mark + "; wait"}})
		if err == nil {
			t.Fatal("Exec with an expiring ctx returned no error")
		}
		harness.Wait(t, "the command's processes to go", func() (bool, error) {
			if pids := hostProcesses("sleep\x00" + mark + "\x00"); len(pids) > 0 {
				return false, &leftError{pids}
			}
			return true, nil
		})
	})
}

type leftError struct{ pids []int }

func (e *leftError) Error() string { return "processes left: " + strconv.Itoa(len(e.pids)) }

// localAddresses reads the LOCAL host addresses out of /proc/net/fib_trie.
func localAddresses(trie string) []string {
	var out []string
	lines := strings.Split(trie, "\n")
	for i := 1; i < len(lines); i++ {
		if strings.Contains(lines[i], "/32 host LOCAL") {
			if f := strings.Fields(lines[i-1]); len(f) == 2 && f[0] == "|--" {
				out = append(out, f[1])
			}
		}
	}
	return out
}

// hostProcesses finds processes on the host whose command line contains cmdline.
func hostProcesses(cmdline string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && bytes.Contains(append(b, 0), []byte(cmdline)) {
			pids = append(pids, pid)
		}
	}
	return pids
}
