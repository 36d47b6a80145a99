package sandbox_test

import (
	"testing"

	"github.com/go-logr/logr"
	"go.uber.org/goleak"
	"k8s.io/klog/v2"

	"github.com/boxcar-run/boxcar/internal/spawn"
)

func TestMain(m *testing.M) {
	// client-go logs, through klog, each exec stream whose ctx ended it; these tests end many
	// on purpose.
	klog.SetLogger(logr.Discard())
	// client-go's WebSocket heartbeat notices that its connection closed only at its next
	// tick, up to 5 s after an exec stream ended by its ctx.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(spawn.StarterFunc), goleak.IgnoreTopFunction("k8s.io/client-go/tools/remotecommand.(*heartbeat).start"))
}
