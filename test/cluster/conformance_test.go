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
