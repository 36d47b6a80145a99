package queue

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
)

// ProfilesBucket is the key-value bucket where each live worker keeps the names and
// descriptions of the profiles it defines, under a key of its own (profilesKey): its worker id
// and a random id of the process, so that workers sharing an id (the default, the host name)
// each keep their entry. An entry expires profilesTTL after the worker's last refresh, so a
// worker that died drops out by itself.
const ProfilesBucket = "BOXCAR_PROFILES"

// profilesTTL and profilesRefresh: a worker writes its entry every profilesRefresh; three
// missed refreshes and the entry is gone.
const (
	profilesTTL     = 90 * time.Second
	profilesRefresh = 30 * time.Second
)

// ErrNoProfiles marks a client that found no live worker's profiles (no bucket, or no entry):
// whether a profile exists cannot be told.
var ErrNoProfiles = errors.New("no live worker has published its profiles")

// ProfileInfo is what a client learns of one profile: its name, the config's description and
// the caps a watcher shows progress against.
type ProfileInfo struct {
	Name         string        `json:"name"`
	Description  string        `json:"description,omitempty"`
	MaxTurns     int           `json:"max_turns,omitempty"`
	MaxToolCalls int           `json:"max_tool_calls,omitempty"`
	MaxTokens    int64         `json:"max_tokens,omitempty"`
	JobTimeout   time.Duration `json:"job_timeout,omitempty"`
	// Tenants are the tenants the worker grants the profile to; empty from a worker before
	// tenants, which granted it to everyone, or with GrantedToNone.
	Tenants []string `json:"tenants,omitempty"`
	// GrantedToNone marks a profile the worker defines and grants to no tenant: its Tenants
	// is empty for that reason, not because the worker is older than tenants. A worker before
	// it published no such marker, and no such profile either.
	GrantedToNone bool `json:"granted_to_none,omitempty"`
	// MaxInputBytes is the profile's max_input_bytes; 0 from a worker before it was published.
	MaxInputBytes int64 `json:"max_input_bytes,omitempty"`
	// Network is NetworkDigest of the profile; empty for a profile without a network, or from a
	// worker before it was published. Another worker whose digest differs may allow a network
	// this one does not; the hosts themselves are not published to every tenant.
	Network string `json:"network,omitempty"`
}

// GrantedTo reports whether the worker grants the profile to tenant.
func (p ProfileInfo) GrantedTo(tenant string) bool {
	return p.GrantedToAll() || slices.Contains(p.Tenants, tenant)
}

// GrantedToAll reports whether the entry is a worker's before tenants, which granted every
// profile to every tenant: no tenants listed, and not for want of a grant.
func (p ProfileInfo) GrantedToAll() bool { return len(p.Tenants) == 0 && !p.GrantedToNone }

// NetworkDigest names a profile's network allow list, in any order, by its SHA-256; "" for a
// profile without a network.
func NetworkDigest(p config.Profile) string {
	if p.Network == nil {
		return ""
	}
	allow := slices.Sorted(slices.Values(p.Network.Allow))
	sum := sha256.Sum256([]byte(strings.Join(allow, "\n")))
	return hex.EncodeToString(sum[:16])
}

// WorkerProfiles is one worker's entry in ProfilesBucket.
type WorkerProfiles struct {
	Worker    string        `json:"worker"`
	Profiles  []ProfileInfo `json:"profiles"`
	UpdatedAt time.Time     `json:"updated_at"`
}

// AdvertiseProfiles keeps this worker's profiles, with the tenants each is granted to, in
// ProfilesBucket until ctx ends, then
// removes its entry. A failed write is tried again at the next refresh: clients only lose the
// check, never a job. It returns nil when ctx ends.
func (c *Consumer) AdvertiseProfiles(ctx context.Context, worker string, profiles map[string]config.Profile, tenants map[string]config.Tenant) error {
	entry := WorkerProfiles{Worker: worker}
	for name, p := range profiles {
		var granted []string
		for t, grant := range tenants {
			if grant.Granted(name) {
				granted = append(granted, t)
			}
		}
		sort.Strings(granted)
		entry.Profiles = append(entry.Profiles, ProfileInfo{Name: name, Description: p.Description, Tenants: granted, GrantedToNone: len(granted) == 0,
			MaxTurns: p.Limits.MaxTurns, MaxToolCalls: p.Limits.MaxToolCalls, MaxTokens: p.Limits.MaxTokens, JobTimeout: time.Duration(p.Limits.JobTimeout),
			MaxInputBytes: p.Limits.MaxInputBytes, Network: NetworkDigest(p)})
	}
	sort.Slice(entry.Profiles, func(i, j int) bool { return entry.Profiles[i].Name < entry.Profiles[j].Name })
	key := profilesKey(worker, randomID())
	var kv jetstream.KeyValue
	tick := time.NewTicker(profilesRefresh)
	defer tick.Stop()
	for {
		var err error
		if kv == nil {
			// Bound, not created: `worker setup` declares it, so an identity that may not
			// create buckets advertises too; one made by an older setup is created here.
			kv, err = c.js.KeyValue(ctx, ProfilesBucket)
			if errors.Is(err, jetstream.ErrBucketNotFound) {
				kv, err = declareBucket(ctx, c.js, profilesBucketConfig(c.cfg.Replicas))
			}
		}
		if err == nil {
			entry.UpdatedAt = time.Now().UTC()
			_, err = kv.Put(ctx, key, mustJSON(entry))
		}
		if err != nil && ctx.Err() == nil {
			kv = nil
			c.log.DebugContext(ctx, "publishing the worker's profiles failed; trying again", "error", err)
		}
		select {
		case <-ctx.Done():
			if kv != nil {
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
				_ = kv.Delete(dctx, key)
				cancel()
			}
			return nil
		case <-tick.C:
		}
	}
}

// profilesKey is one worker process's key: its worker id made a valid key (anything but
// letters, digits, '-' and '_' becomes '_', so ids may share it) and run, an id of the process
// no other has. Each worker writes and, when it stops, deletes only its own entry; readers
// list them all.
func profilesKey(worker, run string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, worker) + "." + run
}

// randomID is 16 random hex digits.
func randomID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// LiveProfiles returns every live worker's entry, by worker id. It needs NATS only, not the
// store. ErrNoProfiles when there is none.
func (c *Client) LiveProfiles(ctx context.Context) ([]WorkerProfiles, error) {
	return liveProfiles(ctx, c.js)
}

// LiveProfiles is Client.LiveProfiles for a worker: its pod reaper spares the warm pods of
// the workers that live.
func (c *Consumer) LiveProfiles(ctx context.Context) ([]WorkerProfiles, error) {
	return liveProfiles(ctx, c.js)
}

func liveProfiles(ctx context.Context, js jetstream.JetStream) ([]WorkerProfiles, error) {
	kv, err := js.KeyValue(ctx, ProfilesBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, ErrNoProfiles
	}
	if err != nil {
		return nil, fmt.Errorf("queue: look up bucket %s: %w", ProfilesBucket, err)
	}
	// Listed and read by direct gets, not watched: a tenant's identity creates no consumer,
	// and the worker needs none for this either.
	entries, err := listEntries(ctx, js, kv, ">")
	if err != nil {
		return nil, fmt.Errorf("queue: read bucket %s: %w", ProfilesBucket, err)
	}
	var out []WorkerProfiles
	for _, e := range entries {
		var wp WorkerProfiles
		if json.Unmarshal(e.Value(), &wp) == nil {
			out = append(out, wp)
		}
	}
	if len(out) == 0 {
		return nil, ErrNoProfiles
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Worker < out[j].Worker })
	return out, nil
}

// profilesBucketConfig is ProfilesBucket as the operator declares it.
func profilesBucketConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket: ProfilesBucket, Description: "Boxcar: the profiles each live worker defines",
		TTL: profilesTTL, History: 1, Storage: jetstream.MemoryStorage, Replicas: replicas,
	}
}
