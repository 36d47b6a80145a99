package store

import "errors"

var (
	// ErrNotFound marks an object that does not exist.
	ErrNotFound = errors.New("object not found")
	// ErrExists marks a create-only put that lost: the object already exists.
	ErrExists = errors.New("object already exists")
	// ErrMaybeStored marks a create-only put (PutOnce) that failed after its body was sent
	// and whose object the store could not show: it may hold the body, or may yet (a request
	// still on its way). Putting the same bytes again settles it.
	ErrMaybeStored = errors.New("the object may or may not be stored")
	// ErrInvalidKey marks a key that is empty, absolute or climbs with "..".
	ErrInvalidKey = errors.New("invalid object key")
	// ErrCredentials marks a request the store could not sign: no credentials could be had
	// (none in the environment or the shared files, no identity of the machine, a
	// credential_process that failed). Waiting rarely changes that, unless the error also
	// carries a server's 5xx (STS or the instance metadata service down).
	ErrCredentials = errors.New("no usable credentials for the store (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run with the machine's identity)")
	// ErrReadRefused marks an object the store refuses the worker reading (S3's AccessDenied, a
	// file store's permission denied) while it reads the store's own object: a policy on that
	// key, or its file's or folders' mode, not on the worker.
	ErrReadRefused = errors.New("the store refuses the worker reading the object")
)

// ErrInvalidURL marks a store URL that Open cannot use: an unknown scheme, a relative file
// path, a missing bucket, credentials in the URL.
var ErrInvalidURL = errors.New("invalid store URL")
