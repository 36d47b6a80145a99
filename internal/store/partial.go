package store

import (
	"context"
	"time"
)

// Partial is a write that never finished and that List does not show: the file store's
// temporary file, or an S3 multipart upload neither completed nor aborted. A writer that ends
// normally removes its own; one killed mid-upload (the OOM killer, a node lost) leaves it
// behind for ever, as big as what it had written, unless `submit gc` discards it.
type Partial struct {
	// Key is where it lies: the temporary file's own key (folder/.boxcar-tmp-…), or the key
	// of the object the upload would have become.
	Key string
	// Size is the bytes it holds.
	Size int64
	// Started is when it was last written to (file) or begun (S3).
	Started time.Time
	// upload is the S3 upload's id.
	upload string
}

// leftovers is a backend whose writes can outlive their writer.
type leftovers interface {
	Partials(ctx context.Context, prefix string) ([]Partial, error)
	DiscardPartial(ctx context.Context, p Partial) error
	PruneFolders(ctx context.Context, prefix string) error
}

// Partials lists the unfinished writes whose keys start with prefix; a backend that leaves
// none lists none.
func Partials(ctx context.Context, st Store, prefix string) ([]Partial, error) {
	if l, ok := st.(leftovers); ok {
		return l.Partials(ctx, prefix)
	}
	return nil, nil
}

// DiscardPartial removes an unfinished write Partials listed; one gone already is no error.
// Only a write whose writer is gone may be discarded: a live one fails.
func DiscardPartial(ctx context.Context, st Store, p Partial) error {
	if l, ok := st.(leftovers); ok {
		return l.DiscardPartial(ctx, p)
	}
	return nil
}

// PruneFolders removes the empty folders under prefix, a folder ("runs/x/attempts/y/"),
// prefix's own included: the file store keeps a folder after its last object went. S3 has no
// folders.
func PruneFolders(ctx context.Context, st Store, prefix string) error {
	if l, ok := st.(leftovers); ok {
		return l.PruneFolders(ctx, prefix)
	}
	return nil
}
