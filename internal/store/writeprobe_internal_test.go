package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/smithy-go"
)

// TestWriteProofsHoldPerFolder: a proof of writes is held per folder, a success for the
// interval, a refusal for a tenth of it, an outage for nobody; callers that come while one is
// in flight take its result, so a queue of one tenant's jobs costs one write; and the proof of
// a caller whose context ended is not another caller's answer.
func TestWriteProofsHoldPerFolder(t *testing.T) {
	refused := fmt.Errorf("store: %w under tenants/b/", ErrWriteRefused)
	outage := errors.New("503 SlowDown")
	tests := []struct {
		name     string
		result   error
		interval time.Duration
		held     bool // a second call within the interval writes nothing
	}{
		{"proved", nil, time.Hour, true},
		{"refused", refused, time.Hour, true},
		{"refused, past its tenth", refused, 10 * time.Nanosecond, false},
		{"outage", outage, time.Hour, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var w writeProofs
			var puts atomic.Int64
			put := func(context.Context) error { puts.Add(1); return tt.result }
			for range 2 {
				if err := w.prove(t.Context(), "tenants/b/", tt.interval, put); !errors.Is(err, tt.result) {
					t.Fatalf("prove = %v, want %v", err, tt.result)
				}
				time.Sleep(20 * time.Nanosecond) // past the shortest interval, which no other row holds to
			}
			if want := map[bool]int64{true: 1, false: 2}[tt.held]; puts.Load() != want {
				t.Errorf("%d writes for two calls, want %d", puts.Load(), want)
			}
			// Another folder is proven on its own.
			if err := w.prove(t.Context(), "tenants/c/", tt.interval, func(context.Context) error { return nil }); err != nil {
				t.Errorf("another folder's proof = %v", err)
			}
		})
	}
}

// TestWriteProofsOneInFlight: the callers that come while a proof runs wait for it and take
// its result, and write nothing; one whose context ends while it waits returns at once.
func TestWriteProofsOneInFlight(t *testing.T) {
	var w writeProofs
	release, started := make(chan struct{}), make(chan struct{})
	var puts atomic.Int64
	put := func(context.Context) error {
		if puts.Add(1) == 1 {
			close(started)
		}
		<-release
		return nil
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	wg.Go(func() { errs[0] = w.prove(t.Context(), "tenants/b/", time.Hour, put) })
	<-started
	for i := 1; i < len(errs); i++ {
		wg.Go(func() { errs[i] = w.prove(t.Context(), "tenants/b/", time.Hour, put) })
	}
	gone, cancel := context.WithCancel(t.Context())
	cancel()
	if err := w.prove(gone, "tenants/b/", time.Hour, put); !errors.Is(err, context.Canceled) {
		t.Errorf("a caller whose context ended while it waited: %v, want context.Canceled", err)
	}
	close(release)
	wg.Wait()
	if puts.Load() != 1 {
		t.Errorf("%d writes for %d callers, want 1", puts.Load(), len(errs))
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("caller %d: %v, want the proof's nil", i, err)
		}
	}
}

// TestWriteProofsNotACancelledCallers: a proof cut short by its caller's context is not the
// answer of a caller whose context lives: that one proves again.
func TestWriteProofsNotACancelledCallers(t *testing.T) {
	var w writeProofs
	first, cancel := context.WithCancel(t.Context())
	started, waiting := make(chan struct{}), make(chan error)
	go func() {
		_ = w.prove(first, "tenants/b/", time.Hour, func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			return fmt.Errorf("put: %w", ctx.Err())
		})
	}()
	<-started
	go func() {
		waiting <- w.prove(t.Context(), "tenants/b/", time.Hour, func(context.Context) error { return nil })
	}()
	cancel()
	if err := <-waiting; err != nil {
		t.Errorf("the living caller's proof = %v, want its own, nil", err)
	}
}

// TestRefusedWriteIsTheStoresOwn: only the store's own refusal of the write is
// ErrWriteRefused; an AccessDenied from where the worker gets its credentials (STS refusing
// AssumeRole, which markedCredentials marks ErrCredentials) refuses every write of every
// tenant for as long as it lasts, and is waited for as the store's outage.
func TestRefusedWriteIsTheStoresOwn(t *testing.T) {
	denied := &smithy.GenericAPIError{Code: "AccessDenied", Message: "not authorized"}
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"the store's AccessDenied", &smithy.OperationError{ServiceID: "S3", OperationName: "PutObject", Err: denied}, true},
		{"the file store's permission denied", &fs.PathError{Op: "open", Path: "runs/x", Err: fs.ErrPermission}, true},
		{"a read-only file system", &fs.PathError{Op: "open", Path: "runs/x", Err: syscall.EROFS}, true},
		{"STS refusing the worker's role", &smithy.OperationError{ServiceID: "S3", OperationName: "PutObject",
			Err: fmt.Errorf("get identity: %w", fmt.Errorf("%w: %w", ErrCredentials, &smithy.OperationError{ServiceID: "STS", OperationName: "AssumeRoleWithWebIdentity", Err: denied}))}, false},
		{"a 503", &smithy.OperationError{ServiceID: "S3", OperationName: "PutObject", Err: &smithy.GenericAPIError{Code: "SlowDown"}}, false},
	} {
		if got := refusedWrite(tt.err); got != tt.want {
			t.Errorf("%s: refusedWrite = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestKeyProbeNoLongerThanItsKey: a key's probe in no tenant's folder is no longer than the key
// (S3 refuses keys over 1,024 bytes), the run's id cut short where the tenant's name is shorter
// than the probe's folder's; an input's key and a run's key of a long tenant's name stay whole.
func TestKeyProbeNoLongerThanItsKey(t *testing.T) {
	t.Parallel()
	const id = "20261207t230000-abcdef012345"
	rows := []struct{ tenant, key, want string }{
		{"team-b", "runs/" + id + "/manifest.json", "tenants/.boxcar-probe/runs/20261207t230000-abcde/manifest.json"},
		{"a", "runs/" + id + "/out/x.bin", "tenants/.boxcar-probe/runs/20261207t230000-/out/x.bin"},
		{"a-tenant-name-of-13", "runs/" + id + "/manifest.json", "tenants/.boxcar-probe/runs/" + id + "/manifest.json"},
		{"team-b", "inputs/sha256/0a1b", "tenants/.boxcar-probe/inputs/sha256/0a1b"},
		{"team-b", "runs/j1/manifest.json", "tenants/.boxcar-probe/runs/j1/manifest.json"},
	}
	for _, tt := range rows {
		folder := TenantPrefix(tt.tenant)
		got := keyProbe(folder, folder+tt.key)
		if got != tt.want {
			t.Errorf("keyProbe(%s, %s) = %s, want %s", folder, tt.key, got, tt.want)
		}
		if strings.HasPrefix(tt.key, "runs/"+id) && len(got) > len(folder+tt.key) {
			t.Errorf("keyProbe of %s%s is %d bytes longer than the key", folder, tt.key, len(got)-len(folder+tt.key))
		}
	}
}
