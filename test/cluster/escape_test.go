package cluster_test

import (
	"context"
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
	sandboxtest.RunEscape(t, sandboxtest.Warm(t, fixedCPU{p}), sandboxtest.Host{PIDs: cluster.PodPIDsLimit})
}

// fixedCPU gives every pod a tenth of a CPU: each warm sandbox of the suite keeps a neighbour
// (sandboxtest.Warm) until its test ends, and at the suite's 500m the node ran out of CPU.
type fixedCPU struct{ *sandbox.KubernetesProvider }

func (p fixedCPU) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	spec.CPU = "100m"
	return p.KubernetesProvider.Start(ctx, spec)
}
