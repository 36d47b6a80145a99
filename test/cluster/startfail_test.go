package cluster_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
	"github.com/boxcar-run/boxcar/test/cluster"
)

// TestStartFailures starts sandboxes that cannot run on the real node: Start must fail soon,
// say why, and leave no pod behind.
func TestStartFailures(t *testing.T) {
	ns := sandboxNamespace(t)
	p := newProvider(t, ns, "startfail")
	tests := []struct {
		name  string
		image string
		want  string // in the error: what the operator reads
	}{
		// Never pulled (imagePullPolicy Never), and not on the node.
		{name: "image not on the node", image: "boxcar.test/missing:1", want: "ErrImageNeverPull"},
		// The pause image has no sh, which the sandbox container runs.
		{name: "image without sh", image: cluster.PauseImage, want: "use an image with a POSIX sh"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			start := time.Now()
			sb, err := p.Start(ctx, sandboxtest.Spec("startfail", config.SandboxSpec{Image: tt.image, CPU: "100m"}))
			if err == nil {
				sb.Close(context.WithoutCancel(ctx))
				t.Fatal("Start succeeded, want an error")
			}
			if errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Start: %v; want a prompt error saying %q", err, tt.want)
			}
			t.Logf("failed after %s: %v", time.Since(start).Round(time.Millisecond), err)
			noSandboxLeft(t, ns)
		})
	}
}
