package egress

import "errors"

// Sentinel errors, for errors.Is.
var (
	// ErrInvalidPolicy means the Policy cannot be used as given (a bad allow entry or secret).
	ErrInvalidPolicy = errors.New("egress: invalid policy")
	// ErrInvalidConfig means the Config cannot be used as given.
	ErrInvalidConfig = errors.New("egress: invalid config")
)
