package config

import "errors"

// ErrInvalid marks a configuration that cannot be used as written.
var ErrInvalid = errors.New("invalid config")

// ErrUnknownProfile marks a job that names a profile this worker does not define.
var ErrUnknownProfile = errors.New("unknown profile")
