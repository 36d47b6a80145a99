package runner

import (
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestPeerTakes: which live worker's profile could take a job this worker's config ended, by
// the end's reason. A peer must grant the profile to the job's tenant; for a network, publish
// an allow list other than this worker's; for inputs, allow as many bytes.
func TestPeerTakes(t *testing.T) {
	t.Parallel()
	narrow := config.Profile{Network: &config.Network{Allow: []string{"a.test"}}}
	wide := config.Profile{Network: &config.Network{Allow: []string{"b.test", "a.test"}}}
	a := &attempt{tenant: "t1", profile: narrow, job: job.Job{Inputs: []job.Input{{Size: 600}, {Size: 400}}}}
	for _, tt := range []struct {
		name   string
		reason string
		peer   queue.ProfileInfo
		want   bool
	}{
		{name: "defines it for the tenant", reason: "unknown_profile", peer: queue.ProfileInfo{Tenants: []string{"t0", "t1"}}, want: true},
		{name: "defines it for everyone (before tenants)", reason: "unknown_profile", peer: queue.ProfileInfo{}, want: true},
		{name: "defines it for another tenant", reason: "unknown_profile", peer: queue.ProfileInfo{Tenants: []string{"t2"}}},
		{name: "grants it", reason: "profile_not_granted", peer: queue.ProfileInfo{Tenants: []string{"t1"}}, want: true},
		{name: "does not grant it either", reason: "profile_not_granted", peer: queue.ProfileInfo{Tenants: []string{"t2"}}},
		{name: "another allow list", reason: "network_not_allowed", peer: queue.ProfileInfo{Network: queue.NetworkDigest(wide)}, want: true},
		{name: "the same allow list, in another order", reason: "network_not_allowed",
			peer: queue.ProfileInfo{Network: queue.NetworkDigest(config.Profile{Network: &config.Network{Allow: []string{"a.test"}}})}},
		{name: "no network", reason: "network_not_allowed", peer: queue.ProfileInfo{}},
		{name: "another allow list, another tenant", reason: "network_not_allowed", peer: queue.ProfileInfo{Tenants: []string{"t2"}, Network: queue.NetworkDigest(wide)}},
		{name: "room for the inputs", reason: "input_too_large", peer: queue.ProfileInfo{MaxInputBytes: 1000}, want: true},
		{name: "no room for the inputs", reason: "input_too_large", peer: queue.ProfileInfo{MaxInputBytes: 999}},
		{name: "a worker before max_input_bytes was published", reason: "input_too_large", peer: queue.ProfileInfo{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := peerTakes[tt.reason](a, tt.peer); got != tt.want {
				t.Errorf("peerTakes[%s](%+v) = %t, want %t", tt.reason, tt.peer, got, tt.want)
			}
		})
	}
}
