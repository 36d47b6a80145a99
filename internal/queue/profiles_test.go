package queue_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestAdvertiseProfiles: a worker's profiles are readable by a client that binds only, and
// gone as soon as the worker stops.
func TestAdvertiseProfiles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client, err := queue.NewClient(context.Background(), b.nc, b.cfg, "default")
	if err != nil {
		t.Fatal(err, "default")
	}
	if _, err := client.LiveProfiles(t.Context()); !errors.Is(err, queue.ErrNoProfiles) {
		t.Fatalf("before any worker: %v, want ErrNoProfiles", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	profiles := map[string]config.Profile{
		"b": {Description: "the second"},
		"a": {Description: "the first", Limits: config.Limits{MaxTurns: 7, MaxToolCalls: 9, MaxTokens: 1000}},
	}
	go func() {
		done <- b.w.AdvertiseProfiles(ctx, "host 1/worker", profiles, map[string]config.Tenant{"t1": {Profiles: []string{"a", "b"}}, "t2": {Profiles: []string{"a"}}})
	}()
	var got []queue.WorkerProfiles
	harness.Wait(t, "the worker's live profiles", func() (bool, error) {
		got, err = client.LiveProfiles(t.Context())
		if err != nil && !errors.Is(err, queue.ErrNoProfiles) {
			return false, fmt.Errorf("%w: %w", harness.ErrStop, err)
		}
		return err == nil, err
	})
	want := []queue.ProfileInfo{{Name: "a", Description: "the first", MaxTurns: 7, MaxToolCalls: 9, MaxTokens: 1000, Tenants: []string{"t1", "t2"}},
		{Name: "b", Description: "the second", Tenants: []string{"t1"}}}
	if len(got) != 1 || got[0].Worker != "host 1/worker" || !reflect.DeepEqual(got[0].Profiles, want) {
		t.Errorf("live profiles = %+v, want worker %q with %+v", got, "host 1/worker", want)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("advertise: %v", err)
	}
	if _, err := client.LiveProfiles(t.Context()); !errors.Is(err, queue.ErrNoProfiles) {
		t.Errorf("after the worker stopped: %v, want ErrNoProfiles", err)
	}
}
