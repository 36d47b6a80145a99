package egress

import "errors"

// Sentinel errors, for errors.Is.
var (
	// ErrInvalidPolicy means the Policy cannot be used as given (a bad allow entry or secret).
	ErrInvalidPolicy = errors.New("egress: invalid policy")
	// ErrInvalidConfig means the Config cannot be used as given.
	ErrInvalidConfig = errors.New("egress: invalid config")
	// ErrSecretValue means a secret's value, as read, cannot be sent or stood in for (too few
	// letters and digits, a line break); it comes with ErrInvalidPolicy. A value read while its
	// file was being rewritten is one: a worker that checked the value at start retries.
	ErrSecretValue = errors.New("unusable secret value")
)
