package store_test

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/storetest"
)

// TestForTenant: a tenant's store is a store like any other.
func TestForTenant(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return store.ForTenant(newFile(t), "team-a") })
}

// TestForTenantStaysInItsFolder: a tenant's objects are under tenants/TENANT/ of the shared
// store, its URLs say so, and no key it is given reaches another tenant's objects.
func TestForTenantStaysInItsFolder(t *testing.T) {
	ctx := t.Context()
	shared := newFile(t)
	a, b := store.ForTenant(shared, "team-a"), store.ForTenant(shared, "team-b")
	key := store.InputKey("00ff")
	if err := a.Put(ctx, key, strings.NewReader("a's"), 3); err != nil {
		t.Fatal(err)
	}
	if _, err := shared.Stat(ctx, "tenants/team-a/inputs/sha256/00ff"); err != nil {
		t.Errorf("the object is not at tenants/team-a/%s: %v", key, err)
	}
	if got, want := a.URL(key), shared.URL("tenants/team-a/"+key); got != want {
		t.Errorf("URL = %q, want %q", got, want)
	}
	tests := []struct {
		name string
		key  string
		want error
	}{
		{"same key, other tenant", key, store.ErrNotFound},
		{"climbing out", "../team-a/" + key, store.ErrInvalidKey},
		{"climbing twice", "runs/../../team-a/" + key, store.ErrInvalidKey},
		{"absolute", "/tenants/team-a/" + key, store.ErrInvalidKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc, err := b.Get(ctx, tt.key)
			if err == nil {
				data, _ := io.ReadAll(rc)
				rc.Close()
				t.Fatalf("team-b read %q under %q", data, tt.key)
			}
			if !errors.Is(err, tt.want) {
				t.Errorf("Get(%q) = %v, want %v", tt.key, err, tt.want)
			}
		})
	}
	if objs, err := b.List(ctx, ""); err != nil || len(objs) != 0 {
		t.Errorf("team-b lists %v, %v; want nothing", objs, err)
	}
	objs, err := a.List(ctx, "inputs/")
	if err != nil || len(objs) != 1 || objs[0].Key != key {
		t.Errorf("team-a lists %+v, %v; want [%s]", objs, err, key)
	}
}
