//go:build integration

package sandbox_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gorilla/websocket"
	"k8s.io/apimachinery/pkg/util/remotecommand"
	"k8s.io/streaming/pkg/httpstream"
	"k8s.io/streaming/pkg/httpstream/spdy"
)

// exec runs argv in the pod as runc exec would and returns the status the kubelet sends.
// stdinEOF reports whether stdin reached its end (the client closed it).
func (p *fakePod) exec(nsenter string, argv []string, stdin io.Reader, stdout, stderr io.Writer, fault func([]string) error) (st metav1.Status, stdinEOF bool) {
	if fault != nil {
		if err := fault(argv); err != nil {
			return internalError(err), false
		}
	}
	if !p.lookPath(argv[0]) {
		// What containerd answers; the kubelet turns it into an internal error, not 127.
		return internalError(fmt.Errorf("failed to exec in container: failed to start exec: OCI runtime exec failed: exec failed: unable to start container process: exec: %q: executable file not found in $PATH: unknown", argv[0])), false
	}
	// The root and working folder of the pod's pid 1, which bwrap started in the container's
	// WorkingDir (--wd=DIR would resolve DIR on the host).
	args := []string{"--target", strconv.Itoa(p.pid), "--user", "--mount", "--pid", "--uts", "--ipc", "--net", "--root", "--wd",
		"--setuid", strconv.FormatInt(p.uid, 10), "--setgid", strconv.FormatInt(p.gid, 10), "--"}
	cmd := exec.Command(nsenter, append(args, argv...)...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = stdout, stderr
	var copied sync.WaitGroup
	if stdin != nil {
		w, err := cmd.StdinPipe()
		if err != nil {
			return internalError(err), false
		}
		copied.Go(func() {
			_, err := io.Copy(w, stdin)
			stdinEOF = err == nil
			w.Close()
			_, _ = io.Copy(io.Discard, stdin) // what the command did not read
		})
	}
	err := cmd.Run()
	if c, ok := stdin.(io.Closer); ok {
		c.Close() // the command is gone: stop waiting for input
	}
	copied.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return metav1.Status{TypeMeta: statusType, Status: metav1.StatusSuccess}, stdinEOF
	case errors.As(err, &ee):
		code := ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
		return metav1.Status{
			TypeMeta: statusType, Status: metav1.StatusFailure, Reason: remotecommand.NonZeroExitCodeReason,
			Message: fmt.Sprintf("command terminated with non-zero exit code: error executing command %q, exit code %d", argv, code),
			Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: remotecommand.ExitCodeCauseType, Message: strconv.Itoa(code)}}},
		}, stdinEOF
	}
	return internalError(err), stdinEOF
}

var statusType = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}

func internalError(err error) metav1.Status {
	st := apierrors.NewInternalError(err).ErrStatus
	st.TypeMeta = statusType
	return st
}

// writeStatus answers a request that is not upgraded, as the API server does.
func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: statusType, Status: metav1.StatusFailure, Code: int32(code), Reason: reason, Message: msg})
}

// serveExec is POST/GET /api/v1/namespaces/{namespace}/pods/{pod}/exec.
func (rt *podRuntime) serveExec(w http.ResponseWriter, r *http.Request) {
	rt.wg.Add(1)
	defer rt.wg.Done()
	if r.Header.Get("Authorization") != "Bearer "+rt.token {
		writeStatus(w, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized")
		return
	}
	q := r.URL.Query()
	argv := q["command"]
	pod := rt.pod(r.PathValue("pod"))
	switch {
	case r.PathValue("namespace") != testNamespace || pod == nil:
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("pods %q not found", r.PathValue("pod")))
		return
	case q.Get("container") != "sandbox":
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("container %q is not valid for pod %s", q.Get("container"), pod.name))
		return
	case len(argv) == 0 || q.Get("stdout") != "true" || q.Get("stderr") != "true" || q.Get("tty") == "true":
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, "want a command, stdout, stderr and no tty")
		return
	}
	stdin := q.Get("stdin") == "true"
	if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		rt.serveWebSocket(w, r, pod, argv, stdin)
		return
	}
	rt.serveSPDY(w, r, pod, argv, stdin)
}

// serveWebSocket speaks the channel protocol: one byte of channel (0 stdin, 1 stdout, 2
// stderr, 3 status, 4 resize) before each binary message; in v5, the message 255 <channel>
// closes a channel (the client's stdin).
func (rt *podRuntime) serveWebSocket(w http.ResponseWriter, r *http.Request, pod *fakePod, argv []string, wantStdin bool) {
	faults := rt.currentFaults()
	if faults.refuseWebSocket != 0 {
		rt.record(execRecord{Transport: "websocket", Refused: faults.refuseWebSocket, Argv: argv})
		writeStatus(w, faults.refuseWebSocket, metav1.StatusReasonForbidden, "websocket upgrades are refused here")
		return
	}
	up := websocket.Upgrader{
		Subprotocols: faults.wsProtocols, ReadBufferSize: 32 << 10, WriteBufferSize: 32 << 10,
		CheckOrigin: func(*http.Request) bool { return true },
	}
	conn, err := up.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader has answered
	}
	defer conn.Close()
	rec := execRecord{Transport: "websocket", Protocol: conn.Subprotocol(), Argv: argv}
	if rec.Protocol == "" {
		// The client asked for no subprotocol this server speaks; it hangs up.
		rt.record(rec)
		return
	}
	var writeMu sync.Mutex
	send := func(channel byte, data []byte) error {
		writeMu.Lock()
		defer writeMu.Unlock()
		_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
		return conn.WriteMessage(websocket.BinaryMessage, append([]byte{channel}, data...))
	}

	stdinRead, stdinWrite := io.Pipe()
	var closeSignal atomic.Bool
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer stdinWrite.Close()
		for {
			typ, data, err := conn.ReadMessage()
			if err != nil {
				return
			}
			if typ != websocket.BinaryMessage || len(data) == 0 {
				continue
			}
			switch {
			case data[0] == remotecommand.StreamClose && rec.Protocol == remotecommand.StreamProtocolV5Name:
				if len(data) == 2 && data[1] == remotecommand.StreamStdIn {
					closeSignal.Store(true)
					stdinWrite.Close()
				}
			case data[0] == remotecommand.StreamStdIn:
				_, _ = stdinWrite.Write(data[1:]) // fails once the command is gone
			}
		}
	}()

	var in io.Reader
	if wantStdin {
		in = stdinRead
	}
	st, _ := pod.exec(rt.nsenter, faults.run(argv), in, channelWriter{send, remotecommand.StreamStdOut}, channelWriter{send, remotecommand.StreamStdErr}, faults.execFault)
	stdinRead.Close()
	rec.Status = st
	status, _ := json.Marshal(st)
	if send(remotecommand.StreamErr, status) == nil {
		writeMu.Lock()
		_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(5*time.Second))
		writeMu.Unlock()
	}
	select {
	case <-readDone: // the client answered the close, or hung up
	case <-time.After(10 * time.Second):
	}
	rec.StdinClosed = closeSignal.Load()
	rt.record(rec)
}

// channelWriter sends a stream on one channel. Once the client is gone it drops what the
// command writes, as a runtime does: a vanished client does not stop the command.
type channelWriter struct {
	send    func(byte, []byte) error
	channel byte
}

func (c channelWriter) Write(p []byte) (int, error) {
	_ = c.send(c.channel, p)
	return len(p), nil
}

// serveSPDY speaks remotecommand v4 over SPDY/3.1, as the kubelet does for older clients:
// one stream per channel, the status as JSON on the error stream.
func (rt *podRuntime) serveSPDY(w http.ResponseWriter, r *http.Request, pod *fakePod, argv []string, wantStdin bool) {
	faults := rt.currentFaults()
	protocol, err := httpstream.Handshake(r, w, []string{remotecommand.StreamProtocolV4Name})
	if err != nil {
		return // Handshake has answered
	}
	type arrival struct {
		stream    httpstream.Stream
		replySent <-chan struct{}
	}
	arrivals := make(chan arrival, 8)
	conn := spdy.NewResponseUpgrader().UpgradeResponse(w, r, func(s httpstream.Stream, replySent <-chan struct{}) error {
		arrivals <- arrival{s, replySent}
		return nil
	})
	if conn == nil {
		return
	}
	defer conn.Close()
	want := 3
	if wantStdin {
		want++
	}
	streams := map[string]httpstream.Stream{}
	timeout := time.After(10 * time.Second)
	for len(streams) < want {
		select {
		case a := <-arrivals:
			<-a.replySent
			streams[a.stream.Headers().Get(corev1.StreamType)] = a.stream
		case <-timeout:
			rt.t.Errorf("spdy exec: got streams %v, want %d", slices.Collect(maps.Keys(streams)), want)
			return
		}
	}
	rec := execRecord{Transport: "spdy", Protocol: protocol, Argv: argv}
	var in io.Reader
	if wantStdin {
		in = streams[corev1.StreamTypeStdin]
	}
	out := dropOnError{streams[corev1.StreamTypeStdout]}
	errOut := dropOnError{streams[corev1.StreamTypeStderr]}
	rec.Status, rec.StdinClosed = pod.exec(rt.nsenter, faults.run(argv), in, out, errOut, faults.execFault)
	status, _ := json.Marshal(rec.Status)
	_, _ = streams[corev1.StreamTypeError].Write(status)
	for _, s := range streams {
		s.Close()
	}
	select {
	case <-conn.CloseChan(): // the client has read everything and hung up
	case <-time.After(10 * time.Second):
	}
	rt.record(rec)
}

// dropOnError keeps a command writing after its client left.
type dropOnError struct{ w io.Writer }

func (d dropOnError) Write(p []byte) (int, error) {
	_, _ = d.w.Write(p)
	return len(p), nil
}
