package provenance

import "errors"

var (
	// ErrInvalid marks a manifest or envelope that cannot be read as Boxcar provenance: not
	// JSON, not an in-toto Statement v1, another predicate type, another job, bad subjects.
	ErrInvalid = errors.New("invalid provenance")
	// ErrDigestMismatch marks a stored object whose SHA-256 or size differs from what the
	// manifest records.
	ErrDigestMismatch = errors.New("digest mismatch")
	// ErrBadSignature marks an envelope whose signature does not verify with the given key,
	// or that signs something other than the stored manifest.
	ErrBadSignature = errors.New("bad signature")
	// ErrUnsigned marks a manifest without an envelope when a public key demands one.
	ErrUnsigned = errors.New("manifest is not signed")
	// ErrMissing marks an object the manifest names that could not be fetched. The store's
	// own error is wrapped too, so errors.Is(err, store.ErrNotFound) tells absence from
	// an unreachable store.
	ErrMissing = errors.New("object missing")
)
