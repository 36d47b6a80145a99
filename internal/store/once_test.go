package store_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/store"
)

// answerStore plays a create-only put whose answer is not what happened: putIfAbsent
// replaces the store's PutIfAbsent, given the real one.
type answerStore struct {
	store.Store
	putIfAbsent func(ctx context.Context, real store.Store, key string, r io.Reader, size int64) error
}

func (s *answerStore) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	return s.putIfAbsent(ctx, s.Store, key, r, size)
}

var errAnswerLost = errors.New("store: put-if-absent: 503 Service Unavailable")

// TestPutOnceTellsWhetherTheObjectIsTheBody: whatever the put answered, PutOnce says whether
// the stored object is the body: a put taken whose answer was lost (then retried and refused,
// as the AWS SDK's retry is) is a success; another object is ErrExists; a body sent of which
// nothing can be seen is ErrMaybeStored; a put that never read its body whole is its own error.
func TestPutOnceTellsWhetherTheObjectIsTheBody(t *testing.T) {
	const key, body, other = "runs/j/manifest.json", `{"mine":true}`, `{"mine":false}`
	tests := []struct {
		name string
		// before is stored under key before the put; "" for nothing.
		before string
		put    func(ctx context.Context, real store.Store, key string, r io.Reader, size int64) error
		want   error // nil, store.ErrExists, store.ErrMaybeStored or errAnswerLost
		stored string
	}{
		{name: "taken", put: passThrough, stored: body},
		{name: "the same bytes were there", before: body, put: passThrough, stored: body},
		{name: "other bytes were there", before: other, put: passThrough, want: store.ErrExists, stored: other},
		{name: "taken, answer lost", put: func(ctx context.Context, real store.Store, key string, r io.Reader, size int64) error {
			if err := real.PutIfAbsent(ctx, key, r, size); err != nil {
				return err
			}
			return errAnswerLost
		}, stored: body},
		{name: "taken, answer lost, retry refused", put: func(ctx context.Context, real store.Store, key string, r io.Reader, size int64) error {
			data, _ := io.ReadAll(r)
			if err := real.PutIfAbsent(ctx, key, strings.NewReader(string(data)), size); err != nil {
				return err
			}
			return real.PutIfAbsent(ctx, key, strings.NewReader(string(data)), size)
		}, stored: body},
		{name: "sent, nothing stored yet", put: func(_ context.Context, _ store.Store, _ string, r io.Reader, _ int64) error {
			_, _ = io.Copy(io.Discard, r)
			return errAnswerLost
		}, want: store.ErrMaybeStored},
		{name: "sent, another's stored meanwhile", put: func(ctx context.Context, real store.Store, key string, r io.Reader, _ int64) error {
			_, _ = io.Copy(io.Discard, r)
			_ = real.PutIfAbsent(ctx, key, strings.NewReader(other), int64(len(other)))
			return errAnswerLost
		}, want: store.ErrExists, stored: other},
		{name: "failed before the body was read", put: func(context.Context, store.Store, string, io.Reader, int64) error {
			return errAnswerLost
		}, want: errAnswerLost},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			real := newFile(t)
			if tt.before != "" {
				if err := real.PutIfAbsent(ctx, key, strings.NewReader(tt.before), int64(len(tt.before))); err != nil {
					t.Fatal(err)
				}
			}
			st := &answerStore{Store: real, putIfAbsent: tt.put}
			_, err := store.PutOnce(ctx, st, key, strings.NewReader(body), int64(len(body)))
			switch {
			case tt.want == nil && err != nil:
				t.Errorf("PutOnce: %v, want nil", err)
			case tt.want != nil && !errors.Is(err, tt.want):
				t.Errorf("PutOnce: %v, want %v", err, tt.want)
			}
			if !errors.Is(tt.want, store.ErrMaybeStored) && errors.Is(err, store.ErrMaybeStored) {
				t.Errorf("PutOnce: %v is ErrMaybeStored, want a settled answer", err)
			}
			if errors.Is(tt.want, store.ErrMaybeStored) && errors.Is(err, store.ErrExists) {
				t.Errorf("PutOnce: %v is ErrExists too: a caller would take it for another's object", err)
			}
			got := ""
			if rc, err := real.Get(ctx, key); err == nil {
				data, _ := io.ReadAll(rc)
				rc.Close()
				got = string(data)
			}
			if got != tt.stored {
				t.Errorf("stored %q, want %q", got, tt.stored)
			}
		})
	}
}

func passThrough(ctx context.Context, real store.Store, key string, r io.Reader, size int64) error {
	return real.PutIfAbsent(ctx, key, r, size)
}
