//go:build integration

package store_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
)

// countingTransport counts the listing requests (ListObjectsV2) an S3 store sends.
type countingTransport struct{ lists atomic.Int32 }

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Query().Get("list-type") == "2" {
		c.lists.Add(1)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// embedding is a store that wraps another by embedding it, as a test's fault-injecting store
// or a command's store that closes another one does.
type embedding struct{ store.Store }

// TestListAtMostThroughWrappers: store.ListAtMost asks the server for no more than the bound
// however the store is wrapped (by embedding, in a tenant's folder, one in the other). A
// wrapper that did not pass ListAtMost on, any that embeds a Store, was listed whole and cut:
// every page of every key a writer of the store put under the folder (versitygw: 1100 planted,
// two pages read for 5 keys asked).
func TestListAtMostThroughWrappers(t *testing.T) {
	srv := s3test.Start(t)
	srv.Env(t)
	bucket := srv.CreateBucket(t)
	counting := &countingTransport{}
	st := newS3(t, srv, bucket, "", store.Options{HTTPClient: &http.Client{Transport: counting}})
	const planted = 1100 // more than a page of the listing (1000)
	plant(t, st, "tenants/t/runs/j/", planted)
	tests := []struct {
		name   string
		st     store.Store
		prefix string
	}{
		{"the store", st, "tenants/t/runs/j/"},
		{"a store embedding it", embedding{st}, "tenants/t/runs/j/"},
		{"a tenant's folder of a store embedding it", store.ForTenant(embedding{st}, "t"), "runs/j/"},
		{"a store embedding a tenant's folder", embedding{store.ForTenant(st, "t")}, "runs/j/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := counting.lists.Load()
			got, more, err := store.ListAtMost(t.Context(), tt.st, tt.prefix, 5)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 5 || !more {
				t.Errorf("ListAtMost(5) = %d objects, more %v; want 5, more", len(got), more)
			}
			if lists := counting.lists.Load() - before; lists != 1 {
				t.Errorf("ListAtMost(5) of a folder of %d objects sent %d listing requests, want 1", planted, lists)
			}
		})
	}
}

// plant puts n small objects under prefix, as a writer of the store can.
func plant(t *testing.T, st store.Store, prefix string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	keys := make(chan string)
	for range 8 {
		wg.Go(func() {
			for k := range keys {
				if err := st.Put(context.WithoutCancel(t.Context()), k, strings.NewReader("x"), 1); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range n {
		keys <- fmt.Sprintf("%sp%05d", prefix, i)
	}
	close(keys)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
