//go:build integration

package sandbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/remotecommand"
	clientremotecommand "k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestKubernetesExecConformance runs the conformance suite through the real pods/exec client
// (WebSocket v5 over TLS with a bearer token) against pods that run for real, with busybox's
// tools and with a distribution's.
func TestKubernetesExecConformance(t *testing.T) {
	for _, image := range []string{imageBusybox, imageDebian} {
		t.Run(image, func(t *testing.T) {
			t.Parallel()
			rt := newPodRuntime(t)
			sandboxtest.Run(t, func(t *testing.T) sandbox.Provider { return rt.provider(t, image) })
		})
	}
}

// execRecordOf waits until the server has recorded the exec whose argv ends with argv (the
// backend wraps every command in sh) over transport, and returns it.
func execRecordOf(t *testing.T, rt *podRuntime, transport string, argv []string) execRecord {
	t.Helper()
	var rec execRecord
	harness.Wait(t, fmt.Sprintf("the server records a %s exec of %q", transport, argv), func() (bool, error) {
		seen := rt.records()
		for _, r := range slices.Backward(seen) {
			if r.Transport == transport && len(r.Argv) >= len(argv) && slices.Equal(r.Argv[len(r.Argv)-len(argv):], argv) {
				rec = r
				return true, nil
			}
		}
		return false, fmt.Errorf("it saw %+v", seen)
	}, harness.Within(10*time.Second))
	return rec
}

// waitNoneLeft waits until no process in pod has mark in its command line.
func waitNoneLeft(t *testing.T, pod *fakePod, mark, what string) {
	t.Helper()
	harness.Wait(t, what, func() (bool, error) {
		var left []string
		for _, proc := range pod.processes(t) {
			if strings.Contains(proc, mark) {
				left = append(left, proc)
			}
		}
		return len(left) == 0, fmt.Errorf("left running: %v", left)
	}, harness.Within(3*time.Second))
}

// idle waits until the pod's pause script sleeps, and returns the pod's processes then: the
// script forks its sleep, and until the child execs, it shows the script's cmdline.
func (p *fakePod) idle(t *testing.T) []string {
	t.Helper()
	var now []string
	harness.Wait(t, "the pod's pause script asleep", func() (bool, error) {
		now = p.processes(t)
		slept := slices.ContainsFunc(now, func(proc string) bool { return strings.HasSuffix(proc, ":sleep 3600") })
		return slept, fmt.Errorf("running: %q", now)
	}, harness.Within(3*time.Second))
	return now
}

func countTransport(rt *podRuntime, transport string) int {
	n := 0
	for _, r := range rt.records() {
		if r.Transport == transport && r.Refused == 0 {
			n++
		}
	}
	return n
}

// exitCause is the exit code a status carries, or "" for none.
func exitCause(st metav1.Status) string {
	if st.Details == nil {
		return ""
	}
	for _, c := range st.Details.Causes {
		if c.Type == remotecommand.ExitCodeCauseType {
			return c.Message
		}
	}
	return ""
}

// TestKubernetesExecWebSocket checks what crosses the v5 channels: stdin on channel 0 and its
// end as the close signal on channel 255, stdout on 1, stderr on 2, and the exit code as a
// metav1.Status on 3.
func TestKubernetesExecWebSocket(t *testing.T) {
	rt := newPodRuntime(t)
	sb := sandboxtest.StartSpec(t, rt.provider(t, imageBusybox), config.SandboxSpec{})
	tests := []struct {
		name                 string
		argv                 []string
		stdin                []byte
		wantExit             int
		wantStdout           string
		wantStderr           string
		wantStatus           string
		wantReason           metav1.StatusReason
		wantCause            string
		wantStdinCloseSignal bool
	}{
		{name: "success", argv: []string{"sh", "-c", "echo ok"}, wantStdout: "ok\n", wantStatus: metav1.StatusSuccess, wantStdinCloseSignal: true},
		{name: "exit 3", argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, wantExit: 3, wantStdout: "out\n", wantStderr: "err\n",
			wantStatus: metav1.StatusFailure, wantReason: remotecommand.NonZeroExitCodeReason, wantCause: "3", wantStdinCloseSignal: true},
		{name: "stdin to its end", argv: []string{"sh", "-c", "cat; echo done >&2"}, stdin: []byte("line 1\nline 2 without end"),
			wantStdout: "line 1\nline 2 without end", wantStderr: "done\n", wantStatus: metav1.StatusSuccess, wantStdinCloseSignal: true},
		{name: "stdout and stderr interleaved", argv: []string{"sh", "-c", "for i in 1 2 3; do echo o$i; echo e$i >&2; done; exit 42"},
			wantExit: 42, wantStdout: "o1\no2\no3\n", wantStderr: "e1\ne2\ne3\n", wantStatus: metav1.StatusFailure, wantReason: remotecommand.NonZeroExitCodeReason, wantCause: "42", wantStdinCloseSignal: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: tt.argv, Stdin: tt.stdin, Timeout: 30 * time.Second})
			if err != nil {
				t.Fatalf("Exec: %v", err)
			}
			if res.ExitCode != tt.wantExit || string(res.Stdout) != tt.wantStdout || string(res.Stderr) != tt.wantStderr {
				t.Errorf("Exec = exit %d, stdout %q, stderr %q; want %d, %q, %q", res.ExitCode, res.Stdout, res.Stderr, tt.wantExit, tt.wantStdout, tt.wantStderr)
			}
			rec := execRecordOf(t, rt, "websocket", tt.argv)
			if rec.Protocol != remotecommand.StreamProtocolV5Name {
				t.Errorf("negotiated %q, want %s", rec.Protocol, remotecommand.StreamProtocolV5Name)
			}
			if rec.Status.Status != tt.wantStatus || rec.Status.Reason != tt.wantReason || exitCause(rec.Status) != tt.wantCause {
				t.Errorf("status channel carried %+v; want status %s, reason %q, exit code cause %q", rec.Status, tt.wantStatus, tt.wantReason, tt.wantCause)
			}
			if rec.StdinClosed != tt.wantStdinCloseSignal {
				t.Errorf("close signal for stdin on channel 255 seen = %v, want %v", rec.StdinClosed, tt.wantStdinCloseSignal)
			}
		})
	}
	if n := countTransport(rt, "spdy"); n != 0 {
		t.Errorf("%d execs went over SPDY, want none while WebSocket works", n)
	}
}

// TestKubernetesExecLargeTransfers moves data larger than a WebSocket frame and a pipe buffer
// each way and checks it byte for byte.
func TestKubernetesExecLargeTransfers(t *testing.T) {
	rt := newPodRuntime(t)
	sb := sandboxtest.StartSpec(t, rt.provider(t, imageBusybox), config.SandboxSpec{})
	data := make([]byte, 3<<20+17)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	if err := sb.WriteFile(t.Context(), "in/random.bin", data); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	res := run(t, sb, "sha256sum", "in/random.bin")
	if got := strings.Fields(string(res.Stdout)); len(got) == 0 || got[0] != hex.EncodeToString(sum[:]) {
		t.Errorf("sha256sum inside = %q, want %x", res.Stdout, sum)
	}
	got, err := sb.ReadFile(t.Context(), "in/random.bin", int64(len(data)))
	if err != nil || !bytes.Equal(got, data) {
		t.Errorf("ReadFile: %d bytes, err %v; want the %d bytes written", len(got), err, len(data))
	}
	res, err = sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"cat"}, Stdin: data, MaxOutputBytes: len(data), Timeout: 30 * time.Second})
	if err != nil || res.ExitCode != 0 || !bytes.Equal(res.Stdout, data) {
		t.Errorf("cat of %d bytes: %d back, exit %d, err %v", len(data), len(res.Stdout), res.ExitCode, err)
	}
}

// TestKubernetesExecFallsBackToSPDY makes the WebSocket upgrade fail in the ways an older API
// server or a proxy does; the command must then run, once, over SPDY.
func TestKubernetesExecFallsBackToSPDY(t *testing.T) {
	tests := []struct {
		name   string
		faults func(*runtimeFaults)
	}{
		{name: "upgrade answered 400", faults: func(f *runtimeFaults) { f.refuseWebSocket = http.StatusBadRequest }},
		{name: "upgrade answered 403", faults: func(f *runtimeFaults) { f.refuseWebSocket = http.StatusForbidden }},
		{name: "server speaks only v4 over WebSocket", faults: func(f *runtimeFaults) { f.wsProtocols = []string{remotecommand.StreamProtocolV4Name} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rt := newPodRuntime(t)
			rt.setFaults(tt.faults)
			sb := sandboxtest.StartSpec(t, rt.provider(t, imageBusybox), config.SandboxSpec{})
			argv := []string{"sh", "-c", "cat; echo err >&2; exit 3"}
			res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: argv, Stdin: []byte("over spdy"), Timeout: 30 * time.Second})
			if err != nil {
				t.Fatalf("Exec: %v", err)
			}
			if res.ExitCode != 3 || string(res.Stdout) != "over spdy" || string(res.Stderr) != "err\n" {
				t.Errorf("Exec = exit %d, stdout %q, stderr %q; want 3, %q, %q", res.ExitCode, res.Stdout, res.Stderr, "over spdy", "err\n")
			}
			ws := execRecordOf(t, rt, "websocket", argv)
			if ws.Refused == 0 && ws.Protocol != "" {
				t.Errorf("the WebSocket attempt ran the command (%+v); want it refused", ws)
			}
			rec := execRecordOf(t, rt, "spdy", argv)
			if rec.Protocol != remotecommand.StreamProtocolV4Name || exitCause(rec.Status) != "3" || !rec.StdinClosed {
				t.Errorf("SPDY exec = %+v; want v4, exit code cause 3, stdin half-closed", rec)
			}
			if n := countTransport(rt, "spdy"); n != 1 {
				t.Errorf("the command ran %d times over SPDY, want once", n)
			}
		})
	}
}

// TestKubernetesExecNoSecondRun is docs/test-cluster.md pitfall 9: only a failed upgrade may send
// a command to SPDY. A command that ran over WebSocket, whatever its end, must not run again.
func TestKubernetesExecNoSecondRun(t *testing.T) {
	rt := newPodRuntime(t)
	p := rt.provider(t, imageBusybox)
	sb := sandboxtest.StartSpec(t, p, config.SandboxSpec{})

	res := run(t, sb, "sh", "-c", "exit 3")
	if res.ExitCode != 3 {
		t.Errorf("exit 3: got %d", res.ExitCode)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sleep", "30"}}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Exec with an expiring ctx: err = %v, want DeadlineExceeded", err)
	}
	rt.setFaults(func(f *runtimeFaults) {
		f.execFault = func([]string) error {
			return errors.New("OCI runtime exec failed: exec failed: container is being torn down: unknown")
		}
	})
	if _, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"true"}}); err == nil {
		t.Error("Exec during a runtime failure: err = nil, want the runtime's error")
	}
	if n := countTransport(rt, "spdy"); n != 0 {
		t.Errorf("%d execs were sent again over SPDY after running over WebSocket, want none", n)
	}
}

// TestKubernetesExecFakeServerSpeaksV4 checks the fake's v4 channel protocol with client-go's
// own v4 WebSocket client: a status on channel 3 without the v5 close signal. (The backend
// itself asks for v5 only: without the close signal, a command reading stdin would never see
// its end; a v4-only server sends it to SPDY, as TestKubernetesExecFallsBackToSPDY shows.)
func TestKubernetesExecFakeServerSpeaksV4(t *testing.T) {
	rt := newPodRuntime(t)
	sb := sandboxtest.StartSpec(t, rt.provider(t, imageBusybox), config.SandboxSpec{})
	argv := []string{"sh", "-c", "echo out; echo err >&2; exit 3"}
	q := url.Values{"container": {"sandbox"}, "stdout": {"true"}, "stderr": {"true"}, "command": argv}
	target := rt.srv.URL + "/api/v1/namespaces/" + testNamespace + "/pods/" + sb.Info().ID + "/exec?" + q.Encode()
	exec, err := clientremotecommand.NewWebSocketExecutorForProtocols(rt.restConfig(), "GET", target, remotecommand.StreamProtocolV4Name)
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	err = exec.StreamWithContext(t.Context(), clientremotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
	var exit utilexec.ExitError
	if !errors.As(err, &exit) || exit.ExitStatus() != 3 {
		t.Fatalf("v4 exec: err = %v, want exit status 3", err)
	}
	if stdout.String() != "out\n" || stderr.String() != "err\n" {
		t.Errorf("v4 exec: stdout %q, stderr %q", stdout.String(), stderr.String())
	}
	if rec := execRecordOf(t, rt, "websocket", argv); rec.Protocol != remotecommand.StreamProtocolV4Name {
		t.Errorf("negotiated %q, want %s", rec.Protocol, remotecommand.StreamProtocolV4Name)
	}
}

// TestKubernetesExecMissingBinary is docs/test-cluster.md pitfall 8: a runtime answers the exec of
// a program the image lacks with an internal-error status, not exit code 127.
func TestKubernetesExecMissingBinary(t *testing.T) {
	rt := newPodRuntime(t)
	p := rt.provider(t, imageBusybox)

	t.Run("missing command is exit code 127", func(t *testing.T) {
		// The backend execs sh, which starts the command: the runtime never sees the missing
		// name, and the result says what happened.
		sb := sandboxtest.StartSpec(t, p, config.SandboxSpec{})
		res := run(t, sb, "boxcar-no-such-command", "arg")
		if res.ExitCode != 127 || !bytes.Contains(res.Stderr, []byte("boxcar-no-such-command")) {
			t.Errorf("Exec = exit %d, stderr %q; want 127 and a message naming the command", res.ExitCode, res.Stderr)
		}
	})
	t.Run("runtime cannot start sh", func(t *testing.T) {
		sb := sandboxtest.StartSpec(t, p, config.SandboxSpec{})
		rt.setFaults(func(f *runtimeFaults) {
			f.execFault = func(argv []string) error {
				return fmt.Errorf("failed to exec in container: failed to start exec: OCI runtime exec failed: exec failed: unable to start container process: exec: %q: executable file not found in $PATH: unknown", argv[0])
			}
		})
		defer rt.setFaults(func(f *runtimeFaults) { f.execFault = nil })
		for _, op := range []struct {
			name string
			do   func() error
		}{
			{"Exec", func() error { _, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"true"}}); return err }},
			{"ReadFile", func() error { _, err := sb.ReadFile(t.Context(), "x", 10); return err }},
			{"WriteFile", func() error { return sb.WriteFile(t.Context(), "x", nil) }},
			{"List", func() error { _, err := sb.List(t.Context(), "."); return err }},
		} {
			err := op.do()
			if !errors.Is(err, sandbox.ErrUnavailable) || errors.Is(err, sandbox.ErrNotFound) {
				t.Errorf("%s: err = %v; want ErrUnavailable (an image without sh), not ErrNotFound", op.name, err)
			}
			if err != nil && !strings.Contains(err.Error(), "POSIX sh") {
				t.Errorf("%s: err = %v; want advice about the image's sh", op.name, err)
			}
		}
	})
	t.Run("image without sh fails at start", func(t *testing.T) {
		start := time.Now()
		_, err := rt.provider(t, imageNoShell).Start(t.Context(), sandboxtest.Spec("no-shell", config.SandboxSpec{}))
		if err == nil || !strings.Contains(err.Error(), "StartError") || !strings.Contains(err.Error(), "POSIX sh") {
			t.Fatalf("Start: err = %v; want the StartError and advice about the image's sh", err)
		}
		if elapsed := time.Since(start); elapsed > 5*time.Second {
			t.Errorf("Start gave up after %v, want at once", elapsed)
		}
		expectNoPods(t, rt.client)
	})
}

// TestKubernetesExecKillsTreeInPod shows that ending the stream is not all: after a timeout, a
// cancelled ctx or Close, nothing the command started is left in the pod, however it forked.
func TestKubernetesExecKillsTreeInPod(t *testing.T) {
	rt := newPodRuntime(t)
	p := rt.provider(t, imageBusybox)
	const script = `sleep 100.%s & (sleep 100.%s; echo late > late.txt) & (trap "" TERM HUP INT; sleep 100.%s) & setsid sleep 100.%s & echo started > started; wait`
	tests := []struct {
		name string
		end  func(sb sandbox.Sandbox, argv []string) error
	}{
		{name: "timeout", end: func(sb sandbox.Sandbox, argv []string) error {
			res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: argv, Timeout: 500 * time.Millisecond})
			if err == nil && !res.TimedOut {
				return fmt.Errorf("TimedOut = false (exit %d), want true", res.ExitCode)
			}
			return err
		}},
		{name: "ctx ends", end: func(sb sandbox.Sandbox, argv []string) error {
			ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
			defer cancel()
			if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: argv}); !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("err = %v, want DeadlineExceeded", err)
			}
			return nil
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sb := sandboxtest.StartSpec(t, p, config.SandboxSpec{})
			marker := fmt.Sprintf("%d%d", time.Now().UnixNano()%1_000_000, i)
			argv := []string{"sh", "-c", fmt.Sprintf(script, marker, marker, marker, marker)}
			begin := time.Now()
			if err := tt.end(sb, argv); err != nil {
				t.Fatal(err)
			}
			if elapsed := time.Since(begin); elapsed > 5*time.Second {
				t.Errorf("Exec returned after %v, want about 500ms", elapsed)
			}
			waitNoneLeft(t, rt.pod(sb.Info().ID), "100."+marker, "nothing left running in the pod after the stream ended")
			if _, err := sb.ReadFile(t.Context(), "started", 100); err != nil {
				t.Errorf("the command never started: %v", err)
			}
		})
	}
}

// TestKubernetesExecAuthenticates shows that the rest.Config's credentials reach the server:
// with a wrong token nothing runs, over either transport.
func TestKubernetesExecAuthenticates(t *testing.T) {
	rt := newPodRuntime(t)
	cfg := rt.restConfig()
	cfg.BearerToken = "wrong"
	p, err := sandbox.NewKubernetes(sandbox.KubernetesConfig{Client: rt.client, RESTConfig: cfg, Namespace: testNamespace, Image: imageBusybox})
	if err != nil {
		t.Fatal(err)
	}
	sb := sandboxtest.StartSpec(t, p, config.SandboxSpec{})
	if _, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"true"}}); err == nil || !strings.Contains(err.Error(), "Unauthorized") {
		t.Errorf("Exec with a wrong token: err = %v, want Unauthorized", err)
	}
	if n := len(rt.records()); n != 0 {
		t.Errorf("the server ran %d execs for a client with a wrong token", n)
	}
}

// TestKubernetesExecKillsFromOutsideWhileTheStreamWaits: a command that outlives the wrapper's
// own kill at its timeout (a fork bomb that fills the pod's process bound leaves that kill no
// process to run) is killed from outside soon after, not only once the stream is given up a
// kill grace later, which held Exec for two kill graces past the timeout.
func TestKubernetesExecKillsFromOutsideWhileTheStreamWaits(t *testing.T) {
	rt := newPodRuntime(t)
	sb := sandboxtest.StartSpec(t, rt.provider(t, imageBusybox), config.SandboxSpec{})
	// The wrapper runs without its timeout: its own kill never comes.
	rt.setFaults(func(f *runtimeFaults) {
		f.execArgv = func(argv []string) []string {
			if len(argv) > 4 && argv[3] == "boxcar-exec" {
				argv[4] = "0"
			}
			return argv
		}
	})
	const timeout = 500 * time.Millisecond
	begin := time.Now()
	res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sleep", "100"}, Timeout: timeout})
	took := time.Since(begin)
	if err != nil || !res.TimedOut || res.ExitCode != 137 {
		t.Fatalf("Exec: err %v, timed out %v, exit %d; want timed out, exit 137", err, res.TimedOut, res.ExitCode)
	}
	// The stream is given up at the timeout + 10 s; the outside kill is due 2 s after the timeout.
	if took >= timeout+10*time.Second {
		t.Errorf("Exec returned after %v: the command was killed only when its stream was given up", took)
	}
	// The server records an exec once its status is sent: the last one may come after Exec.
	kills := func() (n int) {
		for _, rec := range rt.records() {
			if len(rec.Argv) > 3 && rec.Argv[3] == "boxcar-kill" {
				n++
			}
		}
		return n
	}
	harness.Wait(t, "a kill from outside", func() (bool, error) { return kills() > 0, nil }, harness.Within(5*time.Second))
	if n := kills(); n != 1 {
		t.Errorf("%d kills from outside, want 1", n)
	}
}

// TestKubernetesExecLeavesNoWatchdog: the wrapper's timeout watchdog ends with its command.
// Left behind, one sleep per command for a whole timeout, they filled the pod's process bound
// (podPidsLimit 64 on the test cluster) after some 50 quick commands, and the next exec failed
// to start.
func TestKubernetesExecLeavesNoWatchdog(t *testing.T) {
	rt := newPodRuntime(t)
	sb := sandboxtest.StartSpec(t, rt.provider(t, imageBusybox), config.SandboxSpec{})
	timeout := 100*time.Second + time.Duration(time.Now().UnixNano()%1000)*time.Millisecond
	for range 3 {
		res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"true"}, Timeout: timeout})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("true: %v, exit %d", err, res.ExitCode)
		}
	}
	mark := strconv.FormatFloat(timeout.Seconds(), 'f', 3, 64)
	waitNoneLeft(t, rt.pod(sb.Info().ID), mark, "no watchdog left running after its command ended")
}

// TestKubernetesExecKillsTreeWithoutTheMark: a command's processes that shed its mark (env -i,
// env -u) or left its tree (a double fork) are killed with it, at its end and at its timeout:
// the exec script's kill finds them beneath the command, or orphaned to the pod's pid 1
// outside pid 1's session. The pause script and its sleep are left alone.
func TestKubernetesExecKillsTreeWithoutTheMark(t *testing.T) {
	rt := newPodRuntime(t)
	p := rt.provider(t, imageBusybox)
	const quiet = "</dev/null >/dev/null 2>&1"
	// Pushes the pod's next pids past 100: in /proc's order ("1", "100"..."199", "2") the pause
	// script's sleep, pid 2, is then the last process a scan of the pod reads.
	const pastHundred = "i=0; while [ $i -lt 100 ]; do /bin/true; i=$((i+1)); done"
	for i, tt := range []struct {
		name    string
		timeout time.Duration
		script  string
		before  string // run in the pod first, as a command of its own
	}{
		{"env -i, at the end", 0, "env -i sleep 100.%[1]s " + quiet + " & echo started > started; sleep 1", ""},
		{"env -u, at the end", 0, "env -u BOXCAR_EXEC sleep 100.%[1]s " + quiet + " & echo started > started; sleep 1", ""},
		{"env -i, at the timeout", 500 * time.Millisecond, "env -i sleep 100.%[1]s " + quiet + " & echo started > started; sleep 60", ""},
		{"env -u, at the timeout", 500 * time.Millisecond, "env -u BOXCAR_EXEC sleep 100.%[1]s " + quiet + " & echo started > started; sleep 60", ""},
		{"double fork, at the end", 0, "(env -i sh -c 'sleep 100.%[1]s & sleep 100.%[1]s' " + quiet + " &); echo started > started; sleep 1", ""},
		{"double fork, at the timeout", 500 * time.Millisecond, "(env -i sh -c 'sleep 100.%[1]s & sleep 100.%[1]s' " + quiet + " &); echo started > started; sleep 60", ""},
		// The watchdog's kill at the timeout is told to stop (TERM) once the command ends; its
		// trap then killed the pid in a variable the kill had reused for the last /proc entry
		// it read: with pids past 100, the pause script's sleep.
		{"env -i, at the timeout, pids past 100", 500 * time.Millisecond, "env -i sleep 100.%[1]s " + quiet + " & echo started > started; sleep 60", pastHundred},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sb := sandboxtest.StartSpec(t, p, config.SandboxSpec{})
			pod := rt.pod(sb.Info().ID)
			if tt.before != "" {
				if res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sh", "-c", tt.before}}); err != nil || res.ExitCode != 0 {
					t.Fatalf("%s: %v, exit %d", tt.before, err, res.ExitCode)
				}
			}
			pause := pod.idle(t)
			marker := fmt.Sprintf("%d%d", time.Now().UnixNano()%1_000_000, i)
			res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sh", "-c", fmt.Sprintf(tt.script, marker)}, Timeout: tt.timeout})
			if err != nil {
				t.Fatal(err)
			}
			if tt.timeout > 0 && !res.TimedOut {
				t.Errorf("TimedOut = false (exit %d), want true", res.ExitCode)
			}
			if _, err := sb.ReadFile(t.Context(), "started", 100); err != nil {
				t.Fatalf("the command never started: %v", err)
			}
			waitNoneLeft(t, pod, "100."+marker, "nothing the command started is left running in the pod")
			harness.Wait(t, "the pod's own processes as they were before the command", func() (bool, error) {
				now := pod.processes(t)
				return slices.Equal(now, pause), fmt.Errorf("%q before the command, %q after", pause, now)
			}, harness.Within(3*time.Second))
		})
	}
}

// TestKubernetesExecKillSparesAnotherCommand: two commands in a pod overlap. The end of one
// kills what it orphaned, but nothing of the other still running: neither a process beneath
// it that shed its mark, nor an orphan of it that carries its mark. Its own end kills both.
func TestKubernetesExecKillSparesAnotherCommand(t *testing.T) {
	rt := newPodRuntime(t)
	sb := sandboxtest.StartSpec(t, rt.provider(t, imageBusybox), config.SandboxSpec{})
	pod := rt.pod(sb.Info().ID)
	marker := strconv.FormatInt(time.Now().UnixNano()%1_000_000, 10)
	left := func(prefix string) (n int) {
		for _, proc := range pod.processes(t) {
			if strings.HasSuffix(proc, ":sleep "+prefix+marker) {
				n++
			}
		}
		return n
	}
	ran := make(chan error, 1)
	go func() {
		// 1001: beneath the first command, without its mark; 1002: orphaned, with it.
		_, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sh", "-c", fmt.Sprintf("env -u BOXCAR_EXEC sleep 1001.%[1]s & (sleep 1002.%[1]s &); until [ -e done ]; do sleep 0.1; done", marker)}})
		ran <- err
	}()
	harness.Wait(t, "the first command's processes", func() (bool, error) {
		return left("1001.") == 1 && left("1002.") == 1, nil
	}, harness.Within(5*time.Second))
	if _, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sh", "-c", fmt.Sprintf("env -i sleep 1003.%s </dev/null >/dev/null 2>&1 & sleep 0.5", marker)}}); err != nil {
		t.Fatal(err)
	}
	waitNoneLeft(t, pod, "1003."+marker, "nothing of the second command left running")
	if left("1001.") != 1 || left("1002.") != 1 {
		t.Errorf("the second command's end killed the first's processes: %q", pod.processes(t))
	}
	if err := sb.WriteFile(t.Context(), "done", nil); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	waitNoneLeft(t, pod, "1001."+marker, "nothing of the first command left running after its end")
	waitNoneLeft(t, pod, "1002."+marker, "nothing of the first command left running after its end")
}

// TestKubernetesWarmPodAsColdToTheJob: a job sees the same host name in a pod started for it
// and in a warm pod claimed for it, the bubblewrap backend's "boxcar": the pod's own name,
// which a pod's host name is by default, says "boxcar-pool-<profile>-…" in a warm pod and
// "boxcar-<job id>-…" in a cold one, telling the job how its sandbox started.
func TestKubernetesWarmPodAsColdToTheJob(t *testing.T) {
	rt := newPodRuntime(t)
	p := rt.provider(t, imageBusybox)
	cold := sandboxtest.StartSpec(t, p, config.SandboxSpec{})
	spec := sandboxtest.Spec("", config.SandboxSpec{})
	spec.Pool, spec.Ahead = "csv-analyst", time.Hour
	warm, err := p.Start(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = warm.Close(context.WithoutCancel(t.Context())) })
	if err := warm.(sandbox.Claimer).Claim(t.Context(), "default", "job-2"); err != nil {
		t.Fatal(err)
	}
	const script = "hostname; cat /proc/sys/kernel/hostname"
	got := map[string]string{}
	for name, sb := range map[string]sandbox.Sandbox{"cold": cold, "warm": warm} {
		got[name] = string(sandboxtest.Sh(t, sb, script).Stdout)
	}
	if want := "boxcar\nboxcar\n"; got["cold"] != want || got["warm"] != want {
		t.Errorf("host names: cold %q, warm %q; want %q in both", got["cold"], got["warm"], want)
	}
}

// TestKubernetesFileErrorsInTheImagesLanguage: a pod's file script reports its tools' errno
// text, which the worker reads in glibc's or musl's English words (podErrnos). An image whose
// environment names a language (LANGUAGE=de) had its tools say "Datei oder Verzeichnis nicht
// gefunden", which no row reads: a name past NAME_MAX read as an unclassed failure of the
// worker's side. The pod pins the C locale (LC_ALL=C) for everything the worker runs in it;
// the job's commands take the worker's environment and the job's own (env -i), never it.
func TestKubernetesFileErrorsInTheImagesLanguage(t *testing.T) {
	t.Parallel()
	rt := newPodRuntime(t)
	p := rt.provider(t, imageGerman)
	sandboxtest.RunFileErrnos(t, p)

	sb := sandboxtest.Start(t, p)
	res := sandboxtest.Exec(t, sb, sandbox.ExecRequest{
		Argv: []string{"sh", "-c", `echo "LC_ALL=$LC_ALL LANG=$LANG"`}, Env: map[string]string{"LANG": "de_DE.UTF-8"}, Timeout: time.Minute,
	})
	if got, want := strings.TrimSpace(string(res.Stdout)), "LC_ALL= LANG=de_DE.UTF-8"; got != want {
		t.Errorf("the job's command saw %q, want %q: the job's environment wins, and the pod's pinned locale stays the worker's", got, want)
	}
}

// TestKubernetesExecEnvKeepsTheMark: a pod's command is found, to be killed, by the mark its
// processes carry (BOXCAR_EXEC=<nonce>), set before the request's environment. A request
// whose Env named the mark replaced it: at the timeout no process carried it, the command
// ran on in the pod, and Exec held its stream until the kill grace ran out. Every backend
// refuses the name (checkExec).
func TestKubernetesExecEnvKeepsTheMark(t *testing.T) {
	t.Parallel()
	rt := newPodRuntime(t)
	sb := sandboxtest.StartSpec(t, rt.provider(t, imageBusybox), config.SandboxSpec{})
	marker := strconv.FormatInt(time.Now().UnixNano()%1_000_000, 10)
	_, err := sb.Exec(t.Context(), sandbox.ExecRequest{
		Argv: []string{"sleep", "100." + marker}, Env: map[string]string{"BOXCAR_EXEC": "job"}, Timeout: 500 * time.Millisecond,
	})
	if err == nil {
		t.Error("an Env naming BOXCAR_EXEC was taken")
	}
	waitNoneLeft(t, rt.pod(sb.Info().ID), "100."+marker, "nothing of the command left running in the pod")
}
