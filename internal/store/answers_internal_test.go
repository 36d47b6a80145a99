package store

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/aws/smithy-go"
)

// answering is a store double whose every call is answered with err, after a put has read its
// body whole: the answers of s3Answers that versitygw does not give (an expired token, a
// disabled bucket, a skewed clock) as the S3 client returns them.
type answering struct {
	Store
	err error
}

func (a answering) PutIfAbsent(_ context.Context, _ string, r io.Reader, _ int64) error {
	_, _ = io.Copy(io.Discard, r)
	return a.err
}
func (a answering) URL(key string) string                              { return "s3://bucket/" + key }
func (a answering) Get(context.Context, string) (io.ReadCloser, error) { return nil, a.err }

// TestEveryS3AnswerIsSorted: each row of s3Answers, as the server's answer to a create-only put
// whose body was sent, is never "may or may not be stored"; a folder's refusal (AccessDenied)
// is the tenant's (ErrWriteRefused), any other the worker's (ErrWorkerRefused), unless the store
// is a bucket of the tenant's own and the answer refuses that store, which is the tenant's; the
// error says what to change. An answer of no row (a 503) may have been stored.
func TestEveryS3AnswerIsSorted(t *testing.T) {
	rows := append(slices.Clone(s3Answers), s3Answer{code: "SlowDown"})
	for _, row := range rows {
		for _, own := range []bool{false, true} {
			api := &smithy.OperationError{ServiceID: "S3", OperationName: "PutObject", Err: &smithy.GenericAPIError{Code: row.code, Message: "answered"}}
			st := ForTenant(answering{err: translate(api)}, "team-b")
			if own {
				st = ForTenantBucket(answering{err: translate(api)}, "team-b")
			}
			_, err := PutOnce(t.Context(), st, "runs/j/manifest.json", bytes.NewReader([]byte("{}")), 2)
			tenants := row.by == byFolder || own && row.by == byStore
			switch {
			case row.by == 0:
				if !errors.Is(err, ErrMaybeStored) {
					t.Errorf("%s (own bucket %v): %v, want ErrMaybeStored", row.code, own, err)
				}
			case errors.Is(err, ErrMaybeStored):
				t.Errorf("%s (own bucket %v): %v, an answer that stored nothing taken for maybe stored", row.code, own, err)
			case errors.Is(err, ErrWriteRefused) != tenants || errors.Is(err, ErrWorkerRefused) == tenants:
				t.Errorf("%s (own bucket %v): ErrWriteRefused %v, ErrWorkerRefused %v; want the tenant's %v", row.code, own,
					errors.Is(err, ErrWriteRefused), errors.Is(err, ErrWorkerRefused), tenants)
			case row.by != byFolder && !strings.Contains(err.Error(), row.why):
				t.Errorf("%s (own bucket %v): %v does not say %q", row.code, own, err, row.why)
			}
		}
	}
}

// TestEveryAnswerSaysSubmitsOwn: each answer of s3Answers, met by submit's store, names what
// submit's user changes, none of the worker's credentials or settings (store.url,
// store.region, tenants.<name>.bucket): a new row's words are checked too.
func TestEveryAnswerSaysSubmitsOwn(t *testing.T) {
	t.Parallel()
	for _, a := range s3Answers {
		said := (&refusal{err: errors.New(a.code), by: a.by, why: a.why, submitter: true}).Error()
		for _, worker := range []string{"worker", "store.", "tenants.<name>"} {
			if strings.Contains(said, worker) {
				t.Errorf("%s says %q to submit: %s", a.code, worker, said)
			}
		}
	}
}
