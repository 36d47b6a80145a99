package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
)

// Digest is a body's size and SHA-256 (lowercase hex).
type Digest struct {
	Size   int64
	SHA256 string
}

// PutOnce writes an object create-only, as PutIfAbsent does, and says whether the object
// stored under key is this body: nil when it is, whether this call wrote it or an earlier try
// of the same bytes did; an error wrapping ErrExists when another object is there. A put whose
// answer was lost after the server took it, and which the store's client retried (the AWS
// SDK does, three times) or the caller puts again, meets its own object: PutIfAbsent calls
// that ErrExists, PutOnce reads the object back and calls it a success.
//
// A put that fails after its whole body was read may have been taken, or may yet be (a
// request still on its way when its answer was given up). PutOnce reads the object back, and
// when that cannot settle it (there is none yet, or the read fails) the error wraps
// ErrMaybeStored: the caller must not remove anything the object would name, and settles it
// by putting the same bytes again. A put that failed before its body was read whole (the
// store was down, a source error, a refused key) returns the put's error: nothing of it is
// stored, nor can be.
//
// A put the server answered with a refusal took nothing, and putting again changes nothing
// until the operator does: one of the tenant's folder (refusedWrite: S3's AccessDenied, the
// file store's EACCES) wraps ErrWriteRefused, one of the store or the worker (a row of
// s3Answers: the bucket gone, a wrong key, an expired token) ErrWorkerRefused, and a put the
// client could not sign (no credentials) ErrCredentials; never ErrMaybeStored. The read back
// still runs, for an earlier try of the same bytes (the client's retry after a lost answer)
// that took before the refusal; only one of those still on its way when the refusal came is
// missed.
//
// It returns the digest of the body it read, which is the stored object's when err is nil.
func PutOnce(ctx context.Context, st Store, key string, r io.Reader, size int64) (Digest, error) {
	body := &digestReader{r: r, h: sha256.New()}
	err := st.PutIfAbsent(ctx, key, body, size)
	got := Digest{Size: body.n, SHA256: hex.EncodeToString(body.h.Sum(nil))}
	if err != nil && refusedWrite(err) && !errors.Is(err, ErrWriteRefused) {
		err = fmt.Errorf("%w (%w)", err, ErrWriteRefused)
	}
	if err == nil || !body.eof {
		return got, err
	}
	stored, rerr := digestOf(ctx, st, key, got.Size)
	switch {
	case rerr == nil && stored == got:
		return got, nil
	case rerr == nil && errors.Is(err, ErrExists):
		return got, err
	case rerr == nil:
		return got, fmt.Errorf("%v; %w: another object is stored under %s", err, ErrExists, key)
	case tookNothing(err):
		return got, err
	}
	// The read's own cause alone: the client's full error repeats the key and the endpoint,
	// which the put's error already names, and a status line would carry both.
	return got, fmt.Errorf("%w; reading it back could not tell whether it took (%v): %w (put the same bytes again to settle it)", err, innermost(rerr), ErrMaybeStored)
}

// innermost is the last error of err's chain: for a client's error, the cause itself ("dial
// tcp 127.0.0.1:9000: connect: connection refused", "NoSuchKey").
func innermost(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}

// digestReader hashes and counts what a put reads, and notes that it read to the end.
type digestReader struct {
	r   io.Reader
	h   hash.Hash
	n   int64
	eof bool
}

func (d *digestReader) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	d.h.Write(p[:n])
	d.n += int64(n)
	if errors.Is(err, io.EOF) {
		d.eof = true
	}
	return n, err
}

// digestOf reads the object under key and returns its digest, reading no more than one byte
// past want: a larger object is not the one wanted whatever it holds.
func digestOf(ctx context.Context, st Store, key string, want int64) (Digest, error) {
	rc, err := st.Get(ctx, key)
	if err != nil {
		return Digest{}, err
	}
	defer rc.Close()
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(rc, want+1))
	if err != nil {
		return Digest{}, fmt.Errorf("store: read back %s: %w", key, err)
	}
	return Digest{Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}
