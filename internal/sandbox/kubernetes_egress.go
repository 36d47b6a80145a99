package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/boxcar-run/boxcar/internal/sandbox/bridge"
	"github.com/boxcar-run/boxcar/internal/sandbox/tunnel"
)

var _ Egress = (*kubernetesSandbox)(nil)

// The volumes of a pod that can be given egress: the bridge's (the worker binary, read-only
// for the sandbox, with the CA folder's mount point in it) and the CA's.
const (
	bridgeVolume = "egress-bridge"
	caVolume     = "egress-ca"
	bridgeDir    = "/run/boxcar"
	initName     = "egress-bridge"
)

// bridgeSize bounds the bridge's volume: the static worker binary (93 MB stripped, as make image builds it) and room to
// spare. caSize bounds the CA's: the job's CA and the roots the sandbox trusts.
var (
	bridgeSize = resource.MustParse("128Mi")
	caSize     = resource.MustParse("4Mi")
)

// addBridge gives the pod what AttachEgress needs, when the worker has a bridge image: an init
// container that copies the worker binary into the bridge volume, mounted read-only at
// bridgeDir in the sandbox container, and the CA's volume at egressMount. The pod gets no
// route and no port: the tunnel runs over pods/exec. The init container asks for what the
// sandbox does (a pod's request is the larger of the two, so it asks for nothing more), and
// the sandbox's ephemeral storage grows by the two volumes, which count against it.
func (p *KubernetesProvider) addBridge(pod *corev1.Pod) {
	if p.cfg.BridgeImage == "" {
		return
	}
	c := &pod.Spec.Containers[0]
	for _, list := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
		q := list[corev1.ResourceEphemeralStorage]
		q.Add(bridgeSize)
		q.Add(caSize)
		list[corev1.ResourceEphemeralStorage] = q
	}
	init := corev1.Container{
		Name:            initName,
		Image:           p.cfg.BridgeImage,
		ImagePullPolicy: p.cfg.ImagePullPolicy,
		// The worker image has no shell: the binary copies itself (package tunnel).
		Command:         []string{p.cfg.BridgeBinary, tunnel.InstallArg, bridge.Path},
		Resources:       *c.Resources.DeepCopy(),
		SecurityContext: c.SecurityContext.DeepCopy(),
		VolumeMounts:    []corev1.VolumeMount{{Name: bridgeVolume, MountPath: bridgeDir}},
	}
	pod.Spec.InitContainers = append(pod.Spec.InitContainers, init)
	c.VolumeMounts = append(c.VolumeMounts,
		corev1.VolumeMount{Name: bridgeVolume, MountPath: bridgeDir, ReadOnly: true},
		corev1.VolumeMount{Name: caVolume, MountPath: egressMount},
	)
	pod.Spec.Volumes = append(pod.Spec.Volumes,
		corev1.Volume{Name: bridgeVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &bridgeSize}}},
		corev1.Volume{Name: caVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &caSize}}},
	)
}

// podEgressIsolation is added to the manifest's isolation once egress is attached, naming what
// carries the tunnel (overExec or overSession).
func podEgressIsolation(over string) string {
	return "; egress=" + EgressAddr + " tunnelled over " + over + " to the worker's proxy"
}

const (
	overExec    = "pods/exec"
	overSession = "the pod's command session"
)

// caScript writes its stdin to $1 whole or not at all. A command session writes the CA itself
// (tunnel.File, mode caMode); the script is what pods/exec, or a session that predates File,
// runs.
const caScript = `umask 022 && cat > "$1.tmp" && mv -f "$1.tmp" "$1"`

// caMode is the CA's mode: readable by any user of the sandbox, writable by its own.
const caMode = 0o644

// podCAFile is where AttachEgress writes the CA in the pod: EgressCAFile, a variable only so
// that unit tests, whose pod side runs on the test's host, can put it in a folder of theirs.
var podCAFile = EgressCAFile

// AttachEgress writes the CA into the pod, then opens the egress tunnel (package tunnel): from
// then on a connection to EgressAddr in the pod arrives on the returned listener. A pod with a
// command session (a warm pod) gets both over it: the CA written by the session itself, the
// tunnel's connections as streams the session opens toward the worker, no exec of their own.
// A pod without one, or whose session does not know egress (an older bridge image), gets
// the tunnel's own exec (openTunnel), a call on the sandbox. Either way Close ends it, and so
// does closing the listener.
func (s *kubernetesSandbox) AttachEgress(ctx context.Context, caPEM []byte) (net.Listener, error) {
	if s.p.cfg.BridgeImage == "" {
		return nil, fmt.Errorf("sandbox: attach egress to pod %s: %w: set sandbox.kubernetes.bridge_image to the worker's image, which holds the egress tunnel", s.name, ErrNoEgress)
	}
	s.egressMu.Lock()
	defer s.egressMu.Unlock()
	if s.egressOn {
		return nil, errors.New("sandbox: attach egress: already attached; a sandbox has one proxy")
	}
	if err := s.writeCA(ctx, caPEM); err != nil {
		return nil, err
	}
	ln, over, err := s.openEgress(ctx)
	if err != nil {
		return nil, err
	}
	s.info.Isolation += podEgressIsolation(over)
	s.egressOn = true
	s.log.Info("egress attached")
	return ln, nil
}

func (s *kubernetesSandbox) writeCA(ctx context.Context, caPEM []byte) error {
	id, err := s.begin(nil)
	if err != nil {
		return fmt.Errorf("sandbox: attach egress: %w", err)
	}
	defer s.end(id)
	stderr := &cappedBuffer{max: 4096}
	code, err := s.run(ctx, tunnel.Command{
		Argv:  []string{"sh", "-c", caScript, "boxcar-ca", podCAFile},
		File:  &tunnel.File{Op: tunnel.FileWrite, Nonce: randomHex(8), Dir: path.Dir(podCAFile), Path: path.Base(podCAFile), Mode: caMode},
		Stdin: bytes.NewReader(caPEM), Stdout: io.Discard, Stderr: stderr,
	})
	if err != nil {
		return s.execFailure(ctx, "attach egress: write the CA", err)
	}
	if code != 0 {
		out, _ := stderr.take()
		return fmt.Errorf("sandbox: attach egress: write the CA at %s in pod %s: exit %d: %s", podCAFile, s.name, code, firstLine(out, nil))
	}
	return nil
}

// openEgress opens the tunnel over the pod's command session when it has one that knows
// egress, else through the tunnel's own exec. A session that could not send the request, or
// whose pod side does not know it, left nothing listening in the pod: the exec's pod side
// then takes bridge.ListenAddr. It returns what carries the tunnel, for the manifest.
func (s *kubernetesSandbox) openEgress(ctx context.Context) (net.Listener, string, error) {
	if s.cmds == nil {
		return s.openTunnel(ctx)
	}
	ln, err := s.cmds.Egress(ctx)
	switch {
	case err == nil:
		return ln, overSession, nil
	case errors.Is(err, tunnel.ErrEgressUnsupported):
		// What the pod's side said is the sandbox's to choose: not logged.
		s.log.Info("egress tunnel over its own exec", "reason", "the command session's bridge predates egress over it")
		return s.openTunnel(ctx)
	case errors.Is(err, tunnel.ErrSessionDown):
		s.log.Info("egress tunnel over its own exec", "reason", "the command session is down")
		return s.openTunnel(ctx)
	}
	return nil, "", fmt.Errorf("sandbox: attach egress: the tunnel over pod %s's command session: %w", s.name, err)
}

// openTunnel starts the tunnel's exec and waits for its pod side to listen.
func (s *kubernetesSandbox) openTunnel(ctx context.Context) (net.Listener, string, error) {
	tctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	id, err := s.begin(cancel)
	if err != nil {
		cancel(nil)
		return nil, "", fmt.Errorf("sandbox: attach egress: %w", err)
	}
	stdinR, stdinW := io.Pipe()
	stdoutR, stdoutW := io.Pipe()
	stderr := &cappedBuffer{max: 4096}
	done := make(chan struct{})
	var runErr error
	go func() {
		defer close(done)
		defer s.end(id)
		runErr = s.p.exec.Exec(tctx, s.p.cfg.Namespace, s.name, []string{bridge.Path, tunnel.Arg}, stdinR, stdoutW, stderr)
		stdoutW.CloseWithError(io.EOF) // the worker's side sees the session end
		stdinR.Close()
	}()
	stop := sync.OnceFunc(func() { cancel(errTunnelClosed); <-done })
	ln, err := tunnel.Listen(ctx, stdoutR, stdinW)
	if err != nil {
		stop()
		said, _ := stderr.take()
		return nil, "", fmt.Errorf("sandbox: attach egress: the tunnel in pod %s did not start (exec: %v; it said %q; is %s a worker image of this version?): %w",
			s.name, runErr, firstLine(said, nil), s.p.cfg.BridgeImage, err)
	}
	return &tunnelListener{Listener: ln, stop: stop}, overExec, nil
}

// errTunnelClosed is why a tunnel's exec was ended: its listener was closed.
var errTunnelClosed = errors.New("egress tunnel closed")

// tunnelListener ends the tunnel's exec when it is closed.
type tunnelListener struct {
	net.Listener
	stop func()
}

func (l *tunnelListener) Close() error {
	err := l.Listener.Close()
	l.stop()
	return err
}
