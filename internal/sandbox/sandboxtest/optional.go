package sandboxtest

import (
	"context"
	"net"

	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// Optional finds each of package sandbox's optional interfaces on a sandbox with sandbox.As,
// by the interface's name: what a wrapper of a sandbox must let its holder find. Package
// sandbox's TestOptionalInterfacesListed fails when an interface it declares is missing here.
var Optional = map[string]func(sandbox.Sandbox) bool{
	"Claimer":      found[sandbox.Claimer],
	"Warmer":       found[sandbox.Warmer],
	"Egress":       found[sandbox.Egress],
	"UsageCounter": found[sandbox.UsageCounter],
}

func found[T any](sb sandbox.Sandbox) bool {
	_, ok := sandbox.As[T](sb)
	return ok
}

// Full is a sandbox with every optional interface, doing nothing; Sandbox's own methods are
// its embedded one's (nil: none may be called).
type Full struct {
	sandbox.Sandbox
}

// Claim does nothing.
func (Full) Claim(context.Context, string, string) error { return nil }

// Warm is done at once.
func (Full) Warm() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// AttachEgress gives no listener.
func (Full) AttachEgress(context.Context, []byte) (net.Listener, error) {
	return nil, sandbox.ErrNoEgress
}

// Usage counts nothing.
func (Full) Usage() (sandbox.Usage, bool) { return sandbox.Usage{}, false }

var (
	_ sandbox.Claimer      = Full{}
	_ sandbox.Warmer       = Full{}
	_ sandbox.Egress       = Full{}
	_ sandbox.UsageCounter = Full{}
)
