package cluster_test

import (
	"context"
	"testing"

	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// TestConformance runs the sandbox conformance suite on real pods.
func TestConformance(t *testing.T) {
	ns := sandboxNamespace(t)
	sandboxtest.Run(t, func(t *testing.T) sandbox.Provider {
		return smallSandboxes{newProvider(t, ns, "conformance")}
	})
}

// smallSandboxes asks for a tenth of a CPU where a spec names none, as a profile may: the
// default of one CPU per pod, requested and limited alike, fits only two pods at once on a
// two-core node, and the suite runs its subtests in parallel.
type smallSandboxes struct{ *sandbox.KubernetesProvider }

func (p smallSandboxes) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if spec.CPU == "" {
		spec.CPU = "100m"
	}
	return p.KubernetesProvider.Start(ctx, spec)
}

// TestConformanceWarm runs the suite on warm pods (a pool's, claimed) with the bridge, so that
// every command and file transfer runs over the pod's command session: a warm pod behaves as
// one started for its job. It needs the release image (make image).
func TestConformanceWarm(t *testing.T) {
	ns := sandboxNamespace(t)
	release, _ := importReleaseImage(t)
	sandboxtest.Run(t, func(t *testing.T) sandbox.Provider {
		p := newProvider(t, ns, "conformance-warm", func(c *sandbox.KubernetesConfig) { c.BridgeImage = release })
		return sandboxtest.Warm(t, tinySandboxes{p})
	})
}

// tinySandboxes asks for a twentieth of a CPU where a spec names none or the default one CPU:
// each warm sandbox of the suite has a neighbour beside it (sandboxtest.Warm), whose spec is
// the profile's defaults.
type tinySandboxes struct{ *sandbox.KubernetesProvider }

func (p tinySandboxes) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if spec.CPU == "" || spec.CPU == "1" {
		spec.CPU = "50m"
	}
	return p.KubernetesProvider.Start(ctx, spec)
}
