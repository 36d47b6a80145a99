package store

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials/processcreds"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"github.com/boxcar-run/boxcar/internal/redact"
)

const (
	// DefaultPartSize is the multipart part size when Options.PartSize is zero: S3's minimum,
	// because a part is what one upload holds in memory (an artifact of 64 MiB should cost the
	// worker a few MiB, not 16), and 10,000 parts of it still carry 48 GiB, far past the
	// artifact cap.
	DefaultPartSize = minPartSize
	// minPartSize is S3's lower bound for every part but the last.
	minPartSize = 5 << 20
	// maxParts is S3's upper bound on the parts of one upload.
	maxParts = 10000
	// abortTimeout bounds the clean-up of a failed multipart upload.
	abortTimeout = 30 * time.Second
)

// bucketName is the shape of an S3 bucket name: 3-63 lowercase letters, digits, '.' and '-'.
var bucketName = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)

// S3 is the s3 backend: objects live in one bucket of any S3-compatible service, under an
// optional key prefix. Every upload carries a SHA-256 checksum that the server verifies;
// bodies larger than one part go up as a multipart upload, one part in memory at a time.
// PutIfAbsent is a conditional write (If-None-Match: *), which AWS S3 and versitygw
// evaluate atomically. Every object carries the Content-Type ContentType derives from its key.
type S3 struct {
	client   *s3.Client
	bucket   string
	prefix   string // "" or "a/b/" with a trailing slash
	partSize int64
	log      *slog.Logger
	// idle is the transport this store made and Close releases; nil when the caller gave the
	// HTTP client.
	idle *http.Transport
	bufs sync.Pool // *[]byte of partSize
	// allowUnsafe lets a server that ignores If-None-Match pass Probe; see
	// Options.AllowUnsafeOverwrite.
	allowUnsafe   bool
	probeInterval time.Duration
	probe         storeProof
	probed        struct { // under probe's lock
		multipart bool // the multipart completion was proven too
		warned    bool // the unsafe server was logged
	}
	writes writeProofs // of the tenants' folders: see proveWrites
	// bucketSeen is when a HEAD of the bucket last found it (UnixNano; 0: never): headAnswer.
	bucketSeen atomic.Int64
}

var _ Store = (*S3)(nil)

// checkEndpoint refuses an endpoint that does not parse, whose whole text the SDK would quote
// in every request's error, credentials and all; the error names the problem only.
func checkEndpoint(endpoint string) error {
	if endpoint == "" {
		return nil
	}
	if _, err := redact.ParseHTTPURL(endpoint); err != nil {
		return fmt.Errorf("store: s3 endpoint: %w: %w", ErrInvalidURL, err)
	}
	return nil
}

// NewS3 returns the store for bucket, with every key under prefix ("" for the whole bucket).
// Credentials come from the AWS SDK's standard chain. It sends no request; the first
// operation shows whether the bucket can be reached.
func NewS3(ctx context.Context, bucket, prefix string, opts Options) (*S3, error) {
	if !bucketName.MatchString(bucket) {
		return nil, fmt.Errorf("store: s3 bucket %q: %w: a bucket name is 3-63 lowercase letters, digits, '.' and '-'", bucket, ErrInvalidURL)
	}
	if err := checkEndpoint(opts.Endpoint); err != nil {
		return nil, err
	}
	prefix = strings.Trim(prefix, "/")
	if prefix != "" && !ValidKey(prefix) {
		return nil, fmt.Errorf("store: s3 prefix %q: %w: a prefix is slash-separated names without \"..\" or empty parts", prefix, ErrInvalidURL)
	}
	if prefix != "" {
		prefix += "/"
	}
	partSize := opts.PartSize
	if partSize == 0 {
		partSize = DefaultPartSize
	}
	if partSize < minPartSize {
		return nil, fmt.Errorf("store: s3: part size %d is below S3's minimum of %d bytes (5 MiB)", partSize, minPartSize)
	}
	maxAttempts := opts.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = 3
	}
	if maxAttempts < 1 {
		return nil, fmt.Errorf("store: s3: max attempts %d: must be at least 1", maxAttempts)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}

	probeInterval := opts.ProbeInterval
	if probeInterval <= 0 {
		probeInterval = defaultProbeInterval
	}
	s := &S3{bucket: bucket, prefix: prefix, partSize: partSize, log: log, allowUnsafe: opts.AllowUnsafeOverwrite, probeInterval: probeInterval}
	s.probe.submitter = opts.Submitter
	loadOpts, err := envLoadOptions(opts.Getenv)
	if err != nil {
		return nil, fmt.Errorf("store: s3 %s: %w", bucket, err)
	}
	loadOpts = append(loadOpts,
		config.WithDefaultRegion("us-east-1"),
		config.WithRetryMaxAttempts(maxAttempts),
	)
	if opts.Region != "" {
		loadOpts = append(loadOpts, config.WithRegion(opts.Region))
	}
	cfg, err := config.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		return nil, fmt.Errorf("store: s3 %s: load AWS config: %w", bucket, err)
	}
	if cfg.Credentials != nil {
		cfg.Credentials = aws.NewCredentialsCache(markedCredentials{cfg.Credentials})
	}
	s.client = s3.NewFromConfig(cfg, func(o *s3.Options) {
		if opts.Endpoint != "" {
			o.BaseEndpoint = aws.String(opts.Endpoint)
		}
		o.UsePathStyle = opts.PathStyle
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenSupported
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenSupported
		// The SDK skips validating multipart (composite) checksums on Get and would log a
		// warning for each; the parts were verified on the way in.
		o.DisableLogOutputChecksumValidationSkipped = true
		switch b, ok := o.HTTPClient.(*awshttp.BuildableClient); {
		case opts.HTTPClient != nil:
			// The caller's client (its CA) as it is, but for redirects (noRedirect).
			c := *opts.HTTPClient
			c.CheckRedirect = noRedirect
			o.HTTPClient = &c
		case ok:
			// The SDK's client is configured by now (AWS_CA_BUNDLE, dial timeouts) but hides
			// its transport; a copy of that transport that this store owns lets Close
			// release the idle connections.
			s.idle = b.GetTransport()
			o.HTTPClient = &http.Client{
				Transport:     s.idle,
				Timeout:       b.GetTimeout(),
				CheckRedirect: noRedirect,
			}
		}
	})
	s.bufs.New = func() any {
		b := make([]byte, s.partSize)
		return &b
	}
	return s, nil
}

// noRedirect is every S3 client's redirect policy: S3 answers with error documents the SDK
// reads, so a redirect is its answer, never followed. Followed, Go's client would resend the
// signed request's Authorization to the same host on another port, and its session token
// (X-Amz-Security-Token, a header Go does not know as secret) to any address.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// Close releases idle connections of the HTTP client the store made itself.
func (s *S3) Close() error {
	if s.idle != nil {
		s.idle.CloseIdleConnections()
	}
	return nil
}

// Put writes an object, replacing any previous one. When size is not -1 the body must hold
// exactly size bytes, otherwise nothing is written.
func (s *S3) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := s.put(ctx, key, r, size, false); err != nil {
		return fmt.Errorf("store: put %s: %w", s.URL(key), s.refusedWhere(ctx, key, err))
	}
	return nil
}

// PutIfAbsent writes an object only if none exists under key, otherwise it returns an error
// wrapping ErrExists and leaves the existing object alone. The server decides, atomically,
// when the upload completes. It refuses (ErrUnsafeServer) to write on a server that Probe
// found not to honour that, so a create-only put is never silently an overwrite.
func (s *S3) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	if !WritableKey(key) {
		return fmt.Errorf("store: put-if-absent %q: %w", key, ErrInvalidKey)
	}
	if err := s.Probe(ctx); err != nil {
		return fmt.Errorf("store: put-if-absent %s: %w", s.URL(key), err)
	}
	if err := s.put(ctx, key, r, size, true); err != nil {
		return fmt.Errorf("store: put-if-absent %s: %w", s.URL(key), s.refusedWhere(ctx, key, err))
	}
	return nil
}

func (s *S3) put(ctx context.Context, key string, r io.Reader, size int64, ifAbsent bool) error {
	if !WritableKey(key) {
		return fmt.Errorf("%w %q: a key the store writes has no control character, nor U+FFFE or U+FFFF", ErrInvalidKey, key)
	}
	if size < -1 {
		return fmt.Errorf("size %d: must be -1 (unknown) or at least 0", size)
	}
	var ifNoneMatch *string
	if ifAbsent {
		ifNoneMatch = aws.String("*")
	}
	br := bufio.NewReader(ctxReader{ctx: ctx, r: r})

	// A known small body gets a buffer of its size; anything else borrows a part buffer.
	var buf []byte
	if size >= 0 && size < s.partSize {
		buf = make([]byte, size)
	} else {
		p := s.bufs.Get().(*[]byte)
		defer s.bufs.Put(p)
		buf = *p
	}
	n, more, err := readPart(br, buf)
	if err != nil {
		return err
	}
	if !more {
		if size >= 0 && int64(n) != size {
			return sizeMismatch(int64(n), size)
		}
		_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
			Bucket:            &s.bucket,
			Key:               aws.String(s.prefix + key),
			Body:              bytes.NewReader(buf[:n]),
			ContentLength:     aws.Int64(int64(n)),
			ChecksumAlgorithm: types.ChecksumAlgorithmSha256,
			ContentType:       aws.String(ContentType(key)),
			IfNoneMatch:       ifNoneMatch,
		})
		return s.translate(err)
	}
	if size >= 0 && size < s.partSize {
		return sizeMismatch(size+1, size) // the exact-size buffer filled and more followed
	}
	return s.putMultipart(ctx, key, br, buf, n, size, ifNoneMatch)
}

// putMultipart uploads a body whose first part is already in buf[:n], one part at a time.
func (s *S3) putMultipart(ctx context.Context, key string, br *bufio.Reader, buf []byte, n int, size int64, ifNoneMatch *string) (err error) {
	full := aws.String(s.prefix + key)
	created, err := s.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{
		Bucket:            &s.bucket,
		Key:               full,
		ChecksumAlgorithm: types.ChecksumAlgorithmSha256,
		ContentType:       aws.String(ContentType(key)),
	})
	if err != nil {
		return fmt.Errorf("create multipart upload: %w", s.translate(err))
	}
	uploadID := created.UploadId
	defer func() {
		if err == nil {
			return
		}
		// The upload is abandoned, whatever ctx says now; parts left behind cost storage.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
		defer cancel()
		if _, abortErr := s.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{
			Bucket: &s.bucket, Key: full, UploadId: uploadID,
		}); abortErr != nil {
			s.log.Warn("store: abort multipart upload failed; the bucket may keep its parts until a lifecycle rule removes them",
				"url", s.URL(key), "upload_id", aws.ToString(uploadID), "error", s.translate(abortErr))
		}
	}()

	var parts []types.CompletedPart
	var total int64
	more := true // the caller saw more after the first part
	for number := int32(1); n > 0; number++ {
		if number > maxParts {
			return fmt.Errorf("body is larger than %d parts of %d bytes; raise the part size", maxParts, s.partSize)
		}
		total += int64(n)
		if size >= 0 && total > size {
			return sizeMismatch(total, size)
		}
		out, err := s.client.UploadPart(ctx, &s3.UploadPartInput{
			Bucket:            &s.bucket,
			Key:               full,
			UploadId:          uploadID,
			PartNumber:        aws.Int32(number),
			Body:              bytes.NewReader(buf[:n]),
			ContentLength:     aws.Int64(int64(n)),
			ChecksumAlgorithm: types.ChecksumAlgorithmSha256,
		})
		if err != nil {
			return fmt.Errorf("upload part %d: %w", number, s.translate(err))
		}
		parts = append(parts, types.CompletedPart{
			ETag:           out.ETag,
			PartNumber:     aws.Int32(number),
			ChecksumSHA256: out.ChecksumSHA256,
		})
		if !more {
			break
		}
		if n, more, err = readPart(br, buf); err != nil {
			return err
		}
	}
	if size >= 0 && total != size {
		return sizeMismatch(total, size)
	}
	_, err = s.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket:          &s.bucket,
		Key:             full,
		UploadId:        uploadID,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
		IfNoneMatch:     ifNoneMatch,
	})
	if err != nil {
		return fmt.Errorf("complete multipart upload: %w", s.translate(err))
	}
	return nil
}

// readPart fills buf from br. more reports whether the body goes on after buf[:n].
func readPart(br *bufio.Reader, buf []byte) (n int, more bool, err error) {
	n, err = io.ReadFull(br, buf)
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return n, false, nil
	case err != nil:
		return n, false, err
	}
	if _, err := br.Peek(1); err != nil {
		if errors.Is(err, io.EOF) {
			return n, false, nil
		}
		return n, false, err
	}
	return n, true, nil
}

// Get opens an object; the error wraps ErrNotFound when there is none.
func (s *S3) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if !ValidKey(key) {
		return nil, fmt.Errorf("store: get %q: %w", key, ErrInvalidKey)
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{
		Bucket:       &s.bucket,
		Key:          aws.String(s.prefix + key),
		ChecksumMode: types.ChecksumModeEnabled,
	})
	if err != nil {
		return nil, fmt.Errorf("store: get %s: %w", s.URL(key), s.readRefusedWhere(ctx, key, s.translate(err)))
	}
	return out.Body, nil
}

// Stat returns an object's size, the content type the server keeps (set from ContentType on
// every put) and its LastModified; the error wraps ErrNotFound when there is none.
func (s *S3) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	if !ValidKey(key) {
		return ObjectInfo{}, fmt.Errorf("store: stat %q: %w", key, ErrInvalidKey)
	}
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{
		Bucket: &s.bucket,
		Key:    aws.String(s.prefix + key),
	})
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("store: stat %s: %w", s.URL(key), s.readRefusedWhere(ctx, key, s.headAnswer(ctx, s.translate(err))))
	}
	return ObjectInfo{Key: key, Size: aws.ToInt64(out.ContentLength), ContentType: aws.ToString(out.ContentType), ModTime: aws.ToTime(out.LastModified)}, nil
}

// Delete removes an object; there being none is not an error (S3 answers both the same).
func (s *S3) Delete(ctx context.Context, key string) error {
	if !ValidKey(key) {
		return fmt.Errorf("store: delete %q: %w", key, ErrInvalidKey)
	}
	if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{
		Bucket: &s.bucket,
		Key:    aws.String(s.prefix + key),
	}); err != nil {
		if errors.Is(s.translate(err), ErrNotFound) {
			return nil
		}
		return fmt.Errorf("store: delete %s: %w", s.URL(key), s.translate(err))
	}
	return nil
}

// List returns the objects whose keys start with prefix, sorted by key, with the size and
// LastModified the listing gives, following every page.
func (s *S3) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	objects, _, err := s.list(ctx, prefix, -1)
	return objects, err
}

// ListAtMost is List of the first n keys the server lists under prefix, and whether it lists
// more (see the package's ListAtMost): it asks for no more than n+1 keys, so whoever may write
// under prefix cannot make its reader page through every key they put there.
func (s *S3) ListAtMost(ctx context.Context, prefix string, n int) ([]ObjectInfo, bool, error) {
	return s.list(ctx, prefix, max(n, 0))
}

// list is List reading at most n keys of the server's listing (n < 0: all of them); more says
// that the listing holds more than n.
func (s *S3) list(ctx context.Context, prefix string, n int) (objects []ObjectInfo, more bool, err error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, false, fmt.Errorf("store: list %s: %w", prefix, err)
	}
	objects = []ObjectInfo{}
	in := &s3.ListObjectsV2Input{
		Bucket:       &s.bucket,
		Prefix:       aws.String(s.prefix + prefix),
		EncodingType: types.EncodingTypeUrl,
	}
	if n >= 0 {
		in.MaxKeys = aws.Int32(int32(min(n+1, 1000))) // n keys and one to tell there are more
	}
	listed := 0 // keys read, those List does not offer among them
	for pages := s3.NewListObjectsV2Paginator(s.client, in); pages.HasMorePages() && !more; {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, false, fmt.Errorf("store: list %s: %w", s.URL(prefix), s.translate(err))
		}
		for _, obj := range page.Contents {
			if listed++; n >= 0 && listed > n {
				more = true
				break
			}
			k, err := listedKey(page.EncodingType, aws.ToString(obj.Key))
			if err != nil {
				return nil, false, fmt.Errorf("store: list %s: %w", s.URL(prefix), err)
			}
			k = strings.TrimPrefix(k, s.prefix)
			// Keys written by other tools may not be valid here ("a//b", a trailing "/"
			// folder marker); Get could not open them, so List does not offer them.
			// The probe object is the store's own, not one of the caller's.
			if ValidKey(k) && k != ProbeKey {
				objects = append(objects, ObjectInfo{Key: k, Size: aws.ToInt64(obj.Size), ModTime: aws.ToTime(obj.LastModified)})
			}
		}
	}
	// S3 sorts by UTF-8 bytes already; not every compatible server does.
	slices.SortFunc(objects, func(a, b ObjectInfo) int { return strings.Compare(a.Key, b.Key) })
	return objects, more, nil
}

// listedKey is a key as ListObjectsV2 listed it: URL-encoded when the answer says so. List asks
// for that, since the answer is XML, which cannot carry every character a key may hold; a
// server that ignores the request (versitygw) sends keys as they are, and says nothing.
func listedKey(encoding types.EncodingType, key string) (string, error) {
	if encoding != types.EncodingTypeUrl {
		return key, nil
	}
	k, err := url.QueryUnescape(key)
	if err != nil {
		return "", fmt.Errorf("decode the listed key %q: %w", key, err)
	}
	return k, nil
}

// credentialProcessError stands for a failed credential_process of the AWS profile. The SDK's
// error quotes the whole output of a process it cannot parse, and that output holds the secret
// key and session token when only the expiration is malformed or a warning line came first;
// the store's errors reach logs, /readyz and job statuses. So only the cause stays (a JSON or
// time syntax error, the exit status), never the SDK's message around it.
func credentialProcessError(proc *processcreds.ProviderError) error {
	if cause := errors.Unwrap(proc.Err); cause != nil {
		return fmt.Errorf("get credentials from the AWS profile's credential_process (its output is not shown: it may hold credentials): %w; run the process by hand to see what it prints", cause)
	}
	// Without a cause the SDK found the output well-formed but not credentials.
	return errors.New("get credentials from the AWS profile's credential_process: its output is not version 1 credentials with AccessKeyId and SecretAccessKey (not shown: it may hold credentials); run the process by hand to see what it prints")
}

// markedCredentials marks every failure to get credentials ErrCredentials, whatever the SDK's
// provider chain said: the SDK gives such failures no type of their own, and a caller that
// waits out a store's faults (submit run) waited its whole timeout for credentials that were
// never there.
type markedCredentials struct{ aws.CredentialsProvider }

func (m markedCredentials) Retrieve(ctx context.Context) (aws.Credentials, error) {
	c, err := m.CredentialsProvider.Retrieve(ctx)
	if err != nil {
		return c, fmt.Errorf("%w: %w", ErrCredentials, err)
	}
	return c, nil
}

// URL returns s3://bucket/prefix/key.
func (s *S3) URL(key string) string { return "s3://" + s.bucket + "/" + s.prefix + key }

func (s *S3) writeProofs() (*writeProofs, time.Duration) { return &s.writes, s.probeInterval }

// remedy names the permission the worker's credentials need, on the resource an IAM or bucket
// policy names it for.
func (s *S3) remedy(folder string) string {
	return fmt.Sprintf("no job of the tenant can be committed there. Grant the worker's credentials s3:PutObject on arn:aws:s3:::%s/%s%s* (in their IAM policy or the bucket's), or give the tenant a bucket they may write (tenants.<name>.bucket)", s.bucket, s.prefix, folder)
}

// keyRemedy names the permission on the key itself.
func (s *S3) keyRemedy(key string) string {
	return fmt.Sprintf("Grant the worker's credentials s3:PutObject on arn:aws:s3:::%s/%s%s, or lift the Deny that names it", s.bucket, s.prefix, key)
}

func (s *S3) keyRefuser(every bool) string { return policyRefuser(every) }

// translate is the package's translate, a refusal said in the words for whoever uses the
// store: a submitter's (Options.Submitter) names submit's credentials and flags.
func (s *S3) translate(err error) error {
	err = translate(err)
	if ref := (*refusal)(nil); s.probe.submitter && errors.As(err, &ref) {
		ref.submitter = true // made by translate for this err alone
	}
	return err
}

// translate maps S3's answers to the package's sentinels, keeping the vendor error for
// everything else but a credential_process failure, whose message could hold credentials; an
// answer that refuses the store or the worker (s3Answers) says what to change, and wraps
// ErrWorkerRefused.
func translate(err error) error {
	if err == nil {
		return nil
	}
	var proc *processcreds.ProviderError
	if errors.As(err, &proc) {
		return fmt.Errorf("%w: %w", ErrCredentials, credentialProcessError(proc))
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "NoSuchKey", "NotFound":
			return ErrNotFound
		case "PreconditionFailed", "ConditionalRequestConflict":
			// A concurrent conditional write to the same key is also an "exists": the
			// other writer is about to win.
			return ErrExists
		}
	}
	var resp *awshttp.ResponseError
	if errors.As(err, &resp) && resp.HTTPStatusCode() == http.StatusPreconditionFailed {
		return ErrExists
	}
	return refusalOf(err)
}

// Partials lists the multipart uploads under prefix that were neither completed nor aborted,
// with the bytes their parts hold: a put aborts its own upload when it fails, so one there was
// left by a writer killed mid-upload, or is a live put's. ListObjects never shows them, and
// the bucket keeps (and bills) their parts until they are aborted.
func (s *S3) Partials(ctx context.Context, prefix string) ([]Partial, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, fmt.Errorf("store: list partial writes %s: %w", prefix, err)
	}
	var partials []Partial
	pages := s3.NewListMultipartUploadsPaginator(s.client, &s3.ListMultipartUploadsInput{Bucket: &s.bucket, Prefix: aws.String(s.prefix + prefix)})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("store: list partial writes %s: %w", s.URL(prefix), s.translate(err))
		}
		for _, u := range page.Uploads {
			k := strings.TrimPrefix(aws.ToString(u.Key), s.prefix)
			if !ValidKey(k) {
				continue // not one of the store's: its keys are valid
			}
			size, err := s.uploadedBytes(ctx, u)
			if err != nil {
				return nil, fmt.Errorf("store: list partial writes %s: %w", s.URL(prefix), err)
			}
			partials = append(partials, Partial{Key: k, Size: size, Started: aws.ToTime(u.Initiated), upload: aws.ToString(u.UploadId)})
		}
	}
	return partials, nil
}

// uploadedBytes adds up the parts of an unfinished upload.
func (s *S3) uploadedBytes(ctx context.Context, u types.MultipartUpload) (int64, error) {
	var n int64
	pages := s3.NewListPartsPaginator(s.client, &s3.ListPartsInput{Bucket: &s.bucket, Key: u.Key, UploadId: u.UploadId})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if errors.Is(s.translate(err), ErrNotFound) || isNoSuchUpload(err) {
			return n, nil // completed or aborted since it was listed
		}
		if err != nil {
			return 0, s.translate(err)
		}
		for _, p := range page.Parts {
			n += aws.ToInt64(p.Size)
		}
	}
	return n, nil
}

// DiscardPartial aborts an upload Partials listed, which removes its parts.
func (s *S3) DiscardPartial(ctx context.Context, p Partial) error {
	if !ValidKey(p.Key) || p.upload == "" {
		return fmt.Errorf("store: abort upload to %q: %w: not an upload Partials listed", p.Key, ErrInvalidKey)
	}
	_, err := s.client.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: &s.bucket, Key: aws.String(s.prefix + p.Key), UploadId: &p.upload})
	if err != nil && !isNoSuchUpload(err) {
		return fmt.Errorf("store: abort upload %s to %s: %w", p.upload, s.URL(p.Key), s.translate(err))
	}
	return nil
}

// PruneFolders does nothing: S3 has no folders.
func (s *S3) PruneFolders(context.Context, string) error { return nil }

// isNoSuchUpload: the upload was completed or aborted already.
func isNoSuchUpload(err error) bool {
	var api smithy.APIError
	return errors.As(err, &api) && api.ErrorCode() == "NoSuchUpload"
}
