package cluster_test

import (
	"testing"

	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
	"github.com/boxcar-run/boxcar/test/cluster"
)

// TestEscape runs the escape and exhaustion suite on real pods, judged from this machine's
// process table (the node is this machine). The disk cases skip: an emptyDir's sizeLimit is
// enforced by eviction, not at write time (docs/sandbox.md). The pods' processes are bounded
// by the kubelet's podPidsLimit, as the pod spec has no bound of its own.
func TestEscape(t *testing.T) {
	ns := sandboxNamespace(t)
	sandboxtest.RunEscape(t, newProvider(t, ns, "escape"), sandboxtest.Host{PIDs: cluster.PodPIDsLimit})
}

// TestEscapeWarm runs the escape suite on warm pods with the bridge, whose commands run over
// the pod's command session. It needs the release image (make image).
func TestEscapeWarm(t *testing.T) {
	ns := sandboxNamespace(t)
	release, _ := importReleaseImage(t)
	p := newProvider(t, ns, "escape-warm", func(c *sandbox.KubernetesConfig) { c.BridgeImage = release })
	sandboxtest.RunEscape(t, sandboxtest.Warm(t, tinySandboxes{p}), sandboxtest.Host{PIDs: cluster.PodPIDsLimit})
}
