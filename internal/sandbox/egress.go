package sandbox

import (
	"context"
	"net"

	"github.com/boxcar-run/boxcar/internal/sandbox/bridge"
)

// Inside every sandbox with egress, commands reach the worker's proxy at EgressAddr, and find
// the proxy's CA (with the roots they should trust for other hosts) at EgressCAFile. Both are
// the same on every backend, so the environment a command gets (HTTP_PROXY and the rest) does
// not depend on where it runs.
const (
	EgressAddr   = bridge.ListenAddr
	EgressCAFile = egressMount + "/ca.pem"
	egressMount  = "/run/boxcar/egress"
)

// Egress is a sandbox whose commands can reach a proxy on the host, and nothing else. A
// sandbox has no network until AttachEgress is called: a backend makes room for the
// connection when the sandbox starts, so that a sandbox started before its job is known (a
// warm pool) can be given its job's proxy later.
type Egress interface {
	// AttachEgress makes EgressAddr inside the sandbox lead to the returned listener: each
	// connection a command opens to it arrives there, and the caller serves it (the egress
	// proxy). caPEM is written at EgressCAFile, read-only for the sandbox. It may be called
	// once; commands that started before it was called have no network. Closing the listener
	// leaves the sandbox's commands with a proxy address that refuses connections.
	AttachEgress(ctx context.Context, caPEM []byte) (net.Listener, error)
}
