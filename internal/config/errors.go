package config

import "errors"

// ErrInvalid marks a configuration that cannot be used as written.
var ErrInvalid = errors.New("invalid config")

// ErrUnknownProfile marks a job that names a profile this worker does not define.
var ErrUnknownProfile = errors.New("unknown profile")

// ErrIncomplete marks a profile with fields left unset where a default belongs: the agent and
// the sandbox backends take a profile as Load returns it and fill in nothing themselves.
var ErrIncomplete = errors.New("incomplete profile")

// ErrSecretUnavailable marks a profile secret whose source cannot be read now (a variable not
// set, a file missing or empty).
var ErrSecretUnavailable = errors.New("secret unavailable")

// ErrUnknownTenant marks a job of a tenant this worker does not serve.
var ErrUnknownTenant = errors.New("unknown tenant")

// ErrProfileNotGranted marks a job whose profile is not granted to its tenant.
var ErrProfileNotGranted = errors.New("profile not granted")
