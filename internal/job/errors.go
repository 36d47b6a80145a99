package job

import "errors"

// ErrInvalid marks a job message that can never be run as written; it is never retried.
var ErrInvalid = errors.New("invalid job")
