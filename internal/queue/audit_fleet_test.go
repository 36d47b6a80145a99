package queue_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

// Two workers on one host with the default worker_id (the host name), as a fleet of workers
// on one machine has: they advertise their profiles under one key. Each write hides the other's
// profiles, and the first to stop deletes the entry the other still relies on: while the
// second runs, `submit profiles` says no worker is live and `submit run` checks nothing.
func TestAuditFleetWorkersSharingAnIDHideEachOthersProfiles(t *testing.T) {
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
		return err == nil && len(live) == 1 && len(live[0].Profiles) == 2, nil
	})

	// Worker 1 stops (SIGTERM); worker 2 runs on.
	stop1()
	if err := <-done1; err != nil {
		t.Fatal(err)
	}
	live, err := client.LiveProfiles(t.Context())
	if errors.Is(err, queue.ErrNoProfiles) {
		t.Errorf("worker 2 (id %q, profiles a and b) is live, but after worker 1 of the same id stopped the profiles bucket says no worker is: %v", host, err)
	} else if err != nil {
		t.Fatal(err)
	} else {
		t.Logf("live: %+v", live)
	}
	stop2()
	<-done2
}
