// Package store owns object storage for inputs and runs: the Store contract, its backends
// (file: a local directory; s3: any S3-compatible service) and the run layout. It knows nothing
// about what the objects mean.
package store

import (
	"context"
	"io"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Store keeps objects under slash-separated keys.
type Store interface {
	// Put writes an object, replacing any previous one. size may be -1 when unknown.
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	// PutIfAbsent writes an object only if none exists under key; otherwise it fails with
	// ErrExists and leaves the existing object as it was.
	PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error
	// Get opens an object; ErrNotFound when there is none. The caller closes the reader.
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// Stat returns an object's size, content type and modification time; ErrNotFound when
	// there is none.
	Stat(ctx context.Context, key string) (ObjectInfo, error)
	// Delete removes an object; there being none is not an error.
	Delete(ctx context.Context, key string) error
	// List returns the objects under prefix, sorted by key, with their size and modification
	// time (not their content type: S3 lists none, Stat gives it).
	List(ctx context.Context, prefix string) ([]ObjectInfo, error)
	// ListAtMost is List bounded by its caller, not by whoever may write under prefix: at most
	// n of the objects under prefix, sorted by key, and whether there are more; see the
	// package's ListAtMost. It is a method of every Store, so a store that wraps another by
	// embedding it passes it on: a fallback on List read every key a writer put there.
	ListAtMost(ctx context.Context, prefix string, n int) ([]ObjectInfo, bool, error)
	// URL names an object for people and other tools (file:///… or s3://bucket/…).
	URL(key string) string
	// Close releases what the store holds (a directory handle, idle connections). The store
	// cannot be used afterwards.
	Close() error
}

// Lister is the Store method ListAtMost asks.
type Lister interface {
	ListAtMost(ctx context.Context, prefix string, n int) ([]ObjectInfo, bool, error)
}

// ListAtMost returns at most n of the objects under prefix, sorted by key, and whether there
// are more: List bounded by its caller, not by whoever may write under prefix. A reader of a
// folder others may write (a run's, by anyone holding the store's write credentials) that
// lists it whole pages through, and holds, every key they put there, a million as one. Which
// n objects is the backend's choice (S3: the first keys; the file store: the first its walk
// meets); the bound holds whatever st returns.
func ListAtMost(ctx context.Context, st Lister, prefix string, n int) ([]ObjectInfo, bool, error) {
	n = max(n, 0)
	objects, more, err := st.ListAtMost(ctx, prefix, n)
	if err != nil || len(objects) <= n {
		return objects, more, err
	}
	return objects[:n], true, nil
}

// ObjectInfo describes a stored object.
type ObjectInfo struct {
	Key  string
	Size int64
	// ContentType is the media type the object is served with; see ContentType. Stat fills it,
	// List does not.
	ContentType string
	// ModTime is when the object was last written: the file's mtime, S3's LastModified (whole
	// seconds on most servers). `submit gc` tells old leftovers from live attempts by it.
	ModTime time.Time
}

// Run layout: where each job's results live. The run's folder holds the manifest and its
// signature; the report, transcript and artifacts are in attempt folders, and only the
// manifest says which one is the run's (see AttemptPrefix).
func InputKey(sha256Hex string) string { return "inputs/sha256/" + sha256Hex }
func RunPrefix(jobID string) string    { return "runs/" + jobID + "/" }
func ManifestKey(jobID string) string  { return RunPrefix(jobID) + "manifest.json" }
func SignatureKey(jobID string) string { return RunPrefix(jobID) + "manifest.dsse.json" }

// AttemptPrefix is the folder of one attempt's objects (report.md, transcript.jsonl,
// artifacts/…) inside the run's folder, attempt being "<delivery>-<random>". Each attempt
// writes only its own folder, create-only, and the committed manifest names the objects of
// the attempt that committed, so no other attempt can change them; see provenance.SubjectKey.
// Runs committed before attempt folders keep those objects in the run's folder itself.
func AttemptPrefix(jobID, attempt string) string {
	return RunPrefix(jobID) + "attempts/" + attempt + "/"
}

// AttemptSignatureKey is where an attempt leaves its manifest's envelope before it commits,
// for a worker that finds the run committed without its signature to copy into place.
func AttemptSignatureKey(jobID, attempt string) string {
	return AttemptPrefix(jobID, attempt) + "manifest.dsse.json"
}

// WritableKey reports whether the store writes an object under key: a ValidKey of valid UTF-8
// with no control character, none XML 1.0 cannot carry (U+FFFE, U+FFFF) and no backslash. S3
// lists keys in XML (ListObjectsV2), and versitygw ignores the listing's encoding-type=url: a
// server that cannot escape a key there lists it as another (versitygw sends U+FFFD) or sends
// an answer the SDK refuses; SeaweedFS stores a backslash as a slash, and lists "a\b" as
// "a/b". An object under such a key could be neither found by a listing nor removed by
// `submit gc` (TestS3KeysWithoutURLEncoding, TestWritableKeysListWithoutURLEncoding). Put and
// PutIfAbsent refuse other keys (ErrInvalidKey), in every backend alike; reads take any
// ValidKey, so an object written before is read as ever. The runner's artifact names follow it.
func WritableKey(key string) bool {
	return ValidKey(key) && utf8.ValidString(key) && !strings.ContainsFunc(key, func(r rune) bool {
		return unicode.IsControl(r) || r == 0xFFFE || r == 0xFFFF || r == '\\'
	})
}

// ValidKey reports whether key is a clean relative key that cannot climb out of a prefix.
func ValidKey(key string) bool {
	if key == "" || strings.HasPrefix(key, "/") || strings.HasSuffix(key, "/") || strings.ContainsRune(key, 0) {
		return false
	}
	for _, part := range strings.Split(key, "/") {
		if part == "" || part == "." || part == ".." {
			return false
		}
	}
	return true
}
