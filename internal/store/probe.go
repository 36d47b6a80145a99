package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
)

// ErrUnsafeServer marks an S3-compatible server that accepted a second create-only put to the
// same key: it ignores If-None-Match, so a committed run could be overwritten by a stale attempt.
var ErrUnsafeServer = errors.New("the S3 server does not refuse a second create-only put (it ignores If-None-Match: *)")

// ProbeKey is the one object the s3 store writes for itself (under its prefix); List does not
// show it. Its presence is what each later probe's create-only put must be refused on.
const ProbeKey = ".boxcar/create-only-probe.txt"

// probeBody says what the object is to whoever finds it in the bucket.
var probeBody = []byte("Boxcar's workers write this object create-only (If-None-Match: *) to prove that the server\n" +
	"refuses a second create-only write to the same key. Leave it; it is never read.\n")

// defaultProbeInterval is how long a proof holds unless Options.ProbeInterval says otherwise.
const defaultProbeInterval = time.Minute

// Probe proves that the store's server refuses a second create-only put, which committing a
// run relies on. Backends that need no proof (the file store's link(2) is atomic) return nil.
// It fails with an error wrapping ErrUnsafeServer on a server that does not, unless the store
// was opened with Options.AllowUnsafeOverwrite; any other error means the store could not be
// reached. Call it when a worker starts and from its readiness check: it is cheap, since a
// proof holds for Options.ProbeInterval (a minute) and re-proving costs one refused PUT.
func Probe(ctx context.Context, st Store) error {
	if p, ok := st.(interface{ Probe(context.Context) error }); ok {
		return p.Probe(ctx)
	}
	return nil
}

// Probe proves that the server refuses a second create-only put, both as PutObject and as the
// completion of a multipart upload; see the package function Probe. The first proof of a store
// writes ProbeKey if it is missing and tries both kinds of put on it; later ones within the
// store's life try one PutObject.
func (s *S3) Probe(ctx context.Context) error {
	return s.probe.hold(s.probeInterval, func() (bool, error) {
		err := s.prove(ctx, !s.probed.multipart)
		switch {
		case err == nil:
			s.probed.multipart = true
		case errors.Is(err, ErrUnsafeServer) && s.allowUnsafe:
			if !s.probed.warned {
				s.log.Warn("store: the S3 server does not honour create-only writes; store.allow_unsafe_overwrite lets the worker run anyway, and a stale attempt can overwrite a committed run",
					"url", s.URL(ProbeKey), "error", err)
				s.probed.warned = true
			}
			err = nil
		case errors.Is(err, ErrUnsafeServer):
			err = fmt.Errorf("store: %s: %w; committed runs could be overwritten by a stale attempt. Use a server that honours conditional writes (as AWS S3, versitygw and SeaweedFS do), or set store.allow_unsafe_overwrite: true to run anyway", s.URL(""), err)
		default:
			// Not reached, not refused: no proof either way, and nothing to keep. A policy that
			// refuses the probe's object refuses the store, not a tenant's folder.
			return false, fmt.Errorf("store: prove create-only puts on %s: %w", s.URL(ProbeKey),
				storeRefusal(err, fmt.Sprintf("arn:aws:s3:::%s/%s%s (s3:PutObject)", s.bucket, s.prefix, ProbeKey)))
		}
		return true, err
	})
}

// storeProof is a store's latest proof of its own object (ProbeKey), which both stores hold:
// Probe holds it for a while, and a refusal of a tenant's key forgets it, to prove the store
// again at once (refusedWhere).
type storeProof struct {
	mu  sync.Mutex
	at  time.Time // of the last proof held, zero before the first
	err error     // its result
	// submitter: the store is a submitter's (Options.Submitter), whose refusals are its own
	// and are not told whose they are.
	submitter bool
}

// mine tells whose a refusal is worth telling: a worker's store's, not a submitter's.
func (p *storeProof) mine(key string) bool { return !p.submitter && key != ProbeKey }

// hold returns the proof held when it is younger than interval, else prove's result, held
// when keep says so. prove runs under the proof's lock: one proof at a time.
func (p *storeProof) hold(interval time.Duration, prove func() (keep bool, err error)) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.at.IsZero() && time.Since(p.at) < interval {
		return p.err
	}
	keep, err := prove()
	if keep {
		p.at, p.err = time.Now(), err
	}
	return err
}

// refusedWhere tells a folder's refusal of a write of key (err; folder says it is one: S3's
// AccessDenied, the file store's EACCES) from the whole store's: a policy set, or a directory
// made read-only, after the store was proven, while that proof still holds, may refuse the
// store's own object too, and then it refuses every tenant, not the folder the write was for.
// The store is proven again at once (probe, the proof forgotten) to tell; a write refused for
// a folder's reason alone keeps err.
func (p *storeProof) refusedWhere(ctx context.Context, key string, err error, folder bool, probe func(context.Context) error) error {
	if !folder || !p.mine(key) {
		return err
	}
	p.mu.Lock()
	p.at = time.Time{}
	p.mu.Unlock()
	if perr := probe(ctx); errors.Is(perr, ErrWorkerRefused) {
		return perr
	}
	return err
}

// prove runs the puts of one proof; multipart adds the multipart completion.
func (s *S3) prove(ctx context.Context, multipart bool) error {
	// Create the probe object unless it is there; a refusal here already proves the point.
	created := false
	switch err := s.put(ctx, ProbeKey, bytes.NewReader(probeBody), int64(len(probeBody)), true); {
	case err == nil:
		created = true
	case !errors.Is(err, ErrExists):
		return err
	}
	if created {
		switch err := s.put(ctx, ProbeKey, bytes.NewReader(probeBody), int64(len(probeBody)), true); {
		case err == nil:
			return fmt.Errorf("%w: PutObject to %s succeeded although the object exists", ErrUnsafeServer, ProbeKey)
		case !errors.Is(err, ErrExists):
			return err
		}
	}
	if multipart {
		return s.proveMultipart(ctx)
	}
	return nil
}

// staleProbeUpload is how old a probe's upload must be before another probe aborts it: a
// probe takes seconds, so one that old was left by a worker killed mid-probe.
const staleProbeUpload = time.Hour

// proveMultipart completes a one-part upload to the existing probe object with If-None-Match
// and wants it refused; the upload is aborted either way.
func (s *S3) proveMultipart(ctx context.Context) (err error) {
	s.abortStaleProbes(ctx)
	full := aws.String(s.prefix + ProbeKey)
	created, err := s.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{
		Bucket: &s.bucket, Key: full, ChecksumAlgorithm: types.ChecksumAlgorithmSha256,
		ContentType: aws.String(ContentType(ProbeKey)),
	})
	if err != nil {
		return s.translate(err)
	}
	defer func() {
		// A refused completion leaves the upload open; it holds one tiny part.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
		defer cancel()
		_, _ = s.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: &s.bucket, Key: full, UploadId: created.UploadId})
	}()
	part, err := s.client.UploadPart(ctx, &s3.UploadPartInput{
		Bucket: &s.bucket, Key: full, UploadId: created.UploadId, PartNumber: aws.Int32(1),
		Body: bytes.NewReader(probeBody), ContentLength: aws.Int64(int64(len(probeBody))),
		ChecksumAlgorithm: types.ChecksumAlgorithmSha256,
	})
	if err != nil {
		return s.translate(err)
	}
	_, err = s.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket: &s.bucket, Key: full, UploadId: created.UploadId, IfNoneMatch: aws.String("*"),
		MultipartUpload: &types.CompletedMultipartUpload{Parts: []types.CompletedPart{{
			ETag: part.ETag, PartNumber: aws.Int32(1), ChecksumSHA256: part.ChecksumSHA256,
		}}},
	})
	switch err = s.translate(err); {
	case err == nil:
		return fmt.Errorf("%w: CompleteMultipartUpload to %s succeeded although the object exists", ErrUnsafeServer, ProbeKey)
	case errors.Is(err, ErrExists):
		return nil
	default:
		return err
	}
}

// abortStaleProbes aborts the probe uploads that workers killed mid-probe left open (their
// deferred abort never ran), each holding one part, so that they do not pile up with every
// such crash. Nothing else lists or aborts them: they are under no prefix `submit gc`
// collects. A server that cannot list uploads leaves them to the bucket's lifecycle rule.
func (s *S3) abortStaleProbes(ctx context.Context) {
	partials, err := s.Partials(ctx, ProbeKey)
	if err != nil {
		s.log.Warn("store: cannot list the probe's unfinished uploads; a bucket lifecycle rule (AbortIncompleteMultipartUpload) removes them", "url", s.URL(ProbeKey), "error", err)
		return
	}
	for _, p := range partials {
		if p.Key != ProbeKey || time.Since(p.Started) < staleProbeUpload {
			continue
		}
		if err := s.DiscardPartial(ctx, p); err != nil {
			s.log.Warn("store: cannot abort a probe upload a killed worker left", "url", s.URL(ProbeKey), "error", err)
		}
	}
}

// refusedWhere is the store's refusedWhere of a write of key refused by err.
func (s *S3) refusedWhere(ctx context.Context, key string, err error) error {
	return s.probe.refusedWhere(ctx, key, err, byFolderAnswer(err), s.Probe)
}

// byFolderAnswer: err is the server's answer of a policy refusing the request (byFolder).
func byFolderAnswer(err error) bool {
	a, ok := answerTo(err)
	return ok && a.by == byFolder
}

// readRefusedWhere tells whose the refusal of a read of key (err, answered AccessDenied, or a
// HEAD's bodiless 403) is: the store proven again refusing the worker (a wrong key, the bucket
// gone) is the worker's; a policy refusing the worker's reads of the store's own object too
// refuses every tenant's inputs and runs, the worker's (ErrWorkerRefused); one that lets it
// read that object refuses this key alone (ErrReadRefused). A proof that cannot tell (an
// outage) keeps err, to be waited out.
func (s *S3) readRefusedWhere(ctx context.Context, key string, err error) error {
	if !byFolderAnswer(err) || !s.probe.mine(key) {
		return err
	}
	if werr := s.refusedWhere(ctx, key, err); errors.Is(werr, ErrWorkerRefused) {
		return werr
	}
	switch rerr := s.readAgain(ctx, ProbeKey); {
	case errors.Is(rerr, ErrReadRefused):
		return &refusal{err: err, by: byStore, why: fmt.Sprintf("a policy refuses the worker's reads of the store's own object %s too, so of every tenant's inputs and runs; grant the worker's credentials s3:GetObject on arn:aws:s3:::%s/%s*", s.URL(ProbeKey), s.bucket, s.prefix)}
	case rerr != nil:
		return err
	}
	return fmt.Errorf("%w: %w; a policy refuses this object alone (the worker reads the store's own %s): grant the worker's credentials s3:GetObject on arn:aws:s3:::%s/%s%s, or lift the Deny that names it",
		ErrReadRefused, err, s.URL(ProbeKey), s.bucket, s.prefix, key)
}

// readAgain reads key and closes it, its refusal for a policy's reason (byFolder)
// ErrReadRefused without proving the store again: it asks after the store's own object
// (readRefusedWhere), or after a read of a tenant's key proved it (readKeyRefused).
func (s *S3) readAgain(ctx context.Context, key string) error {
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: aws.String(s.prefix + key)})
	if err != nil {
		if err = s.translate(err); byFolderAnswer(err) {
			return fmt.Errorf("store: get %s: %w: %w", s.URL(key), ErrReadRefused, err)
		}
		return fmt.Errorf("store: get %s: %w", s.URL(key), err)
	}
	out.Body.Close()
	return nil
}

// headAnswer is the answer of a HEAD of key, err translated: a HEAD's answer has no body, so a
// 404 for a bucket that is gone reads as the key's (ErrNotFound). A 404 is asked of the bucket
// too, and a bucket that is gone is the store's refusal (NoSuchBucket) that a GET would say. A
// bucket found holds for a tenth of the probe interval, so that a claim's stat of a manifest
// not yet committed costs one request, not two, on a busy worker.
func (s *S3) headAnswer(ctx context.Context, err error) error {
	if !errors.Is(err, ErrNotFound) {
		return err
	}
	if seen := s.bucketSeen.Load(); seen != 0 && time.Since(time.Unix(0, seen)) < s.probeInterval/writeRefusalHold {
		return err
	}
	_, berr := s.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &s.bucket})
	if berr == nil {
		s.bucketSeen.Store(time.Now().UnixNano())
	}
	if !errors.Is(s.translate(berr), ErrNotFound) {
		return err
	}
	a, _ := answerTo(&smithy.GenericAPIError{Code: "NoSuchBucket"})
	return &refusal{err: bucketGone{s.bucket}, by: a.by, why: a.why, submitter: s.probe.submitter}
}

// bucketGone is a bucket a HEAD found gone: the refusal a GET's NoSuchBucket is, with the
// HTTP status of one, which a client that classes answers by their status (submit) reads as
// no wait will change.
type bucketGone struct{ bucket string }

func (e bucketGone) Error() string {
	return fmt.Sprintf("NoSuchBucket: the bucket %s is gone (a HEAD of the key and of the bucket answered 404)", e.bucket)
}

func (bucketGone) HTTPStatusCode() int { return http.StatusNotFound }
