package sandbox_test

import (
	"testing"

	"github.com/go-logr/logr"
	"go.uber.org/goleak"
	"k8s.io/klog/v2"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	// client-go logs, through klog, each exec stream whose ctx ended it; these tests end many
	// on purpose.
	klog.SetLogger(logr.Discard())
	// client-go's WebSocket heartbeat notices that its connection closed only at its next
	// tick, up to 5 s after an exec stream ended by its ctx.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("k8s.io/client-go/tools/remotecommand.(*heartbeat).start"))
}

// start starts a sandbox with spec (unset fields at the profile defaults) and closes it at the end.
func start(t testing.TB, p sandbox.Provider, spec config.SandboxSpec) sandbox.Sandbox {
	t.Helper()
	return sandboxtest.StartSpec(t, p, spec)
}
