package queue_test

import (
	"context"
	"errors"
	"fmt"
	"os"
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
		"c": {Description: "granted to no tenant"},
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
		{Name: "b", Description: "the second", Tenants: []string{"t1"}},
		{Name: "c", Description: "granted to no tenant", GrantedToNone: true}}
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

// TestProfileGrantedTo: an entry without tenants is a worker's before tenants, which granted
// every profile to everyone, unless it says the profile is granted to none (today's worker for
// a profile its tenants: section grants to no tenant); read as granting everyone, that entry
// left a job the worker refused to the worker itself until max_deliver.
func TestProfileGrantedTo(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		p    queue.ProfileInfo
		want bool
	}{
		{"granted to the tenant", queue.ProfileInfo{Tenants: []string{"t1", "t2"}}, true},
		{"granted to others", queue.ProfileInfo{Tenants: []string{"t2"}}, false},
		{"granted to none", queue.ProfileInfo{GrantedToNone: true}, false},
		{"a worker before tenants", queue.ProfileInfo{}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.GrantedTo("t1"); got != tt.want {
				t.Errorf("GrantedTo(t1) of %+v = %v, want %v", tt.p, got, tt.want)
			}
		})
	}
}

// TestWorkersSharingAnIDKeepEachOthersProfiles: two workers on one host with the default
// worker_id (the host name), as a fleet of workers on one machine has, each keep an entry of
// their own: neither write hides the other's profiles, and the first to stop deletes its entry
// only, not the one the other still relies on (with one key, `submit profiles` then said no
// worker is live and `submit run` checked nothing while the second ran).
func TestWorkersSharingAnIDKeepEachOthersProfiles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client, err := queue.NewClient(context.Background(), b.nc, b.cfg, "default")
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname() // config's default worker_id
	tenants := map[string]config.Tenant{"default": {Profiles: []string{"a", "b"}}}

	ctx1, stop1 := context.WithCancel(context.Background())
	done1 := make(chan error, 1)
	go func() {
		done1 <- b.w.AdvertiseProfiles(ctx1, host, map[string]config.Profile{"a": {}}, tenants)
	}()
	harness.Wait(t, "worker 1's profiles", func() (bool, error) {
		live, err := client.LiveProfiles(t.Context())
		return err == nil && len(live) == 1 && len(live[0].Profiles) == 1, nil
	})
	ctx2, stop2 := context.WithCancel(context.Background())
	defer stop2()
	done2 := make(chan error, 1)
	go func() {
		done2 <- b.w.AdvertiseProfiles(ctx2, host, map[string]config.Profile{"a": {}, "b": {}}, tenants)
	}()
	harness.Wait(t, "worker 2's profiles", func() (bool, error) {
		live, err := client.LiveProfiles(t.Context())
		return err == nil && len(live) == 2, nil
	})

	// Worker 1 stops (SIGTERM); worker 2 runs on.
	stop1()
	if err := <-done1; err != nil {
		t.Fatal(err)
	}
	live, err := client.LiveProfiles(t.Context())
	switch {
	case errors.Is(err, queue.ErrNoProfiles):
		t.Errorf("worker 2 (id %q, profiles a and b) is live, but after worker 1 of the same id stopped the profiles bucket says no worker is: %v", host, err)
	case err != nil:
		t.Fatal(err)
	case len(live) != 1 || len(live[0].Profiles) != 2:
		t.Errorf("after worker 1 stopped, the live entries are %+v; want worker 2's alone, with profiles a and b", live)
	}
	stop2()
	<-done2
}
