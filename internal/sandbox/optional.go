package sandbox

// The optional interfaces a backend's sandbox may have beside Sandbox: Claimer and Warmer
// (claim.go), Egress (egress.go) and UsageCounter. A caller finds one with As, never with a
// type assertion: the sandbox it holds may be a wrapper (a pool's taken sandbox that gives its
// slot back on Close, a runner's that times each command), which has Sandbox's methods alone.

// UsageCounter is a sandbox that counts what its processes used (bubblewrap's cgroup). Usage
// is false where it can count nothing, and Usage.Missing then says why.
type UsageCounter interface {
	Usage() (Usage, bool)
}

// Wrapper is a sandbox that adds to another's methods: Unwrap returns that other sandbox.
type Wrapper interface {
	Unwrap() Sandbox
}

// As finds an optional interface of sb, or a backend's type, as errors.As finds an error: sb
// itself if it has it, else the first sandbox down its Unwrap chain that has it. A wrapper that
// implements T itself is found before what it wraps.
func As[T any](sb Sandbox) (T, bool) {
	for sb != nil {
		if t, ok := sb.(T); ok {
			return t, true
		}
		w, ok := sb.(Wrapper)
		if !ok {
			break
		}
		sb = w.Unwrap()
	}
	var zero T
	return zero, false
}
