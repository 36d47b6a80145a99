package modelgate

import "errors"

var (
	// ErrOpen marks a request the gate refused without sending it: the endpoint is down (the
	// breaker is open or half-open). Callers wait (Gate.Wait) and send it again.
	ErrOpen = errors.New("model endpoint down: request held by the circuit breaker")
	// ErrInvalidConfig marks a Config that New cannot use.
	ErrInvalidConfig = errors.New("invalid model gate config")
)
