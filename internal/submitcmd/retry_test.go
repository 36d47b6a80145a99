package submitcmd

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestMissingQueueIsWaitedForInACluster: a stream or bucket NATS says is missing ends submit's
// wait at once on a single server, which knows, but is waited for in a JetStream cluster (for
// missingWait: TestMissingQueueInAClusterIsSaidWithoutWaitingThePatience),
// where a server catching up after a restart or an election answers so for one that is there;
// a refusal and the caller's end stop it either way, and an error that may pass waits either way.
func TestMissingQueueIsWaitedForInACluster(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name            string
		err             error
		single, cluster bool // transient there
	}{
		{"bucket missing", fmt.Errorf("%w: status bucket BOXCAR_STATUS does not exist", queue.ErrNotReady), false, true},
		{"tenant's stream missing", fmt.Errorf("%w \"team-a\": its job stream does not exist", queue.ErrNotServed), false, true},
		{"refused by the server", fmt.Errorf("look up: %w", queue.ErrRefused), false, false},
		{"no answer (an election)", context.DeadlineExceeded, true, true},
		{"connection lost", errors.New("nats: connection closed"), true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := transientNATS(false)(tt.err); got != tt.single {
				t.Errorf("single server: transient %v, want %v", got, tt.single)
			}
			if got := transientNATS(true)(tt.err); got != tt.cluster {
				t.Errorf("cluster: transient %v, want %v", got, tt.cluster)
			}
		})
	}
}
