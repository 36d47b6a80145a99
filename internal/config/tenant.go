package config

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/boxcar-run/boxcar/internal/job"
)

// Tenant is what one tenant may run and spend. The tenant itself is the token of the NATS
// subjects its submitter may publish on (boxcar.jobs.TENANT.*): the server enforces who that
// is, the worker only reads it from the subject.
type Tenant struct {
	// Profiles are the profiles granted to the tenant: a job naming another is rejected at its
	// first attempt (profile_not_granted). At least one.
	Profiles []string `json:"profiles"`
	// MaxConcurrent bounds the tenant's jobs running at once across the fleet (its consumer's
	// max_ack_pending). Default: nats.max_ack_pending.
	MaxConcurrent int `json:"max_concurrent,omitempty"`
	// DailyTokens bounds the model tokens the tenant's jobs spend per UTC day, checked before
	// each model request; a job that finds it spent ends capped (budget_exhausted). 0 means
	// unlimited. Default: 0.
	DailyTokens int64 `json:"daily_tokens,omitempty"`
	// MaxQueued and MaxQueuedBytes bound the tenant's job stream (jobs, bytes) instead of
	// nats.job_max_msgs and nats.job_max_bytes: a submission past either is refused. 0 means
	// the nats value. Default: 0.
	MaxQueued      int64 `json:"max_queued,omitempty"`
	MaxQueuedBytes int64 `json:"max_queued_bytes,omitempty"`
	// Bucket is an S3 bucket of the tenant's own, where its inputs and runs go instead of under
	// tenants/TENANT/ in store.url's bucket, so that S3 permissions can keep tenants apart.
	// Needs an s3:// store.url. Default: none.
	Bucket string `json:"bucket,omitempty"`
}

// Granted reports whether the tenant may run the profile.
func (t Tenant) Granted(profile string) bool { return slices.Contains(t.Profiles, profile) }

// TenantsOrDefault returns the tenants this worker serves: the tenants: section, or, without one, the
// single tenant job.DefaultTenant granted every profile (a worker before tenants).
func (c Config) TenantsOrDefault() map[string]Tenant {
	if len(c.Tenants) > 0 {
		return c.Tenants
	}
	names := make([]string, 0, len(c.Profiles))
	for name := range c.Profiles {
		names = append(names, name)
	}
	sort.Strings(names)
	return map[string]Tenant{job.DefaultTenant: {Profiles: names, MaxConcurrent: c.NATS.MaxAckPending}}
}

// Tenant returns the named tenant, or an error wrapping ErrUnknownTenant that lists the tenants
// this worker serves.
func (c Config) Tenant(name string) (Tenant, error) {
	all := c.TenantsOrDefault()
	if t, ok := all[name]; ok {
		return t, nil
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	return Tenant{}, fmt.Errorf("%w %q: this worker serves %s", ErrUnknownTenant, name, strings.Join(names, ", "))
}

// Grant returns the tenant and profile of a job, or an error wrapping ErrUnknownTenant,
// ErrUnknownProfile or ErrProfileNotGranted.
func (c Config) Grant(tenant, profile string) (Tenant, Profile, error) {
	t, err := c.Tenant(tenant)
	if err != nil {
		return Tenant{}, Profile{}, err
	}
	p, err := c.Profile(profile)
	if err != nil {
		return Tenant{}, Profile{}, err
	}
	if !t.Granted(profile) {
		return Tenant{}, Profile{}, fmt.Errorf("%w: tenant %q may run %s, not %q (tenants.%s.profiles in the worker config)",
			ErrProfileNotGranted, tenant, strings.Join(t.Profiles, ", "), profile, tenant)
	}
	return t, p, nil
}

// bucketName is an S3 bucket name.
var bucketName = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)

func (c Config) validateTenants() []error {
	var errs []error
	names := make([]string, 0, len(c.Tenants))
	for name := range c.Tenants {
		names = append(names, name)
	}
	sort.Strings(names)
	profiles := make([]string, 0, len(c.Profiles))
	for name := range c.Profiles {
		profiles = append(profiles, name)
	}
	buckets := map[string]string{}
	for _, name := range names {
		t := c.Tenants[name]
		field := "tenants." + name
		bad := func(f, format string, args ...any) {
			errs = append(errs, &FieldError{Path: field + f, Msg: fmt.Sprintf(format, args...)})
		}
		if !job.ValidTenant(name) {
			bad("", "%q is not a tenant name: %s", name, job.TenantRule)
		}
		if len(t.Profiles) == 0 {
			bad(".profiles", "grants nothing; list the profiles the tenant may run")
		}
		for i, p := range t.Profiles {
			if _, ok := c.Profiles[p]; !ok {
				bad(fmt.Sprintf(".profiles[%d]", i), "%q is not a profile of this config%s", p, suggest(p, profiles))
			}
		}
		if t.MaxConcurrent < 0 {
			bad(".max_concurrent", "must not be negative; leave it unset for nats.max_ack_pending")
		}
		if t.DailyTokens < 0 {
			bad(".daily_tokens", "must not be negative; 0 or unset is unlimited")
		}
		for _, q := range queueBounds {
			if v := q.get(t); v != 0 && v < q.least {
				bad("."+q.key, "%s", q.problem(v))
			}
		}
		errs = append(errs, c.validateBucket(name, t.Bucket, buckets)...)
	}
	return append(errs, c.validateWarmGranted(profiles)...)
}

// queueBound is a key of a tenant that bounds its job stream instead of a nats key.
type queueBound struct {
	key, nats string
	least     int64 // what one job may need
	what      string
	unit      string
	get       func(Tenant) int64
	getNATS   func(NATS) int64
}

// queueBounds are the tenant's overrides of nats.job_max_msgs and nats.job_max_bytes, with
// their minimums: a queue must take one job, the largest message a job may be in bytes.
var queueBounds = []queueBound{
	{"max_queued", "nats.job_max_msgs", 1, "one job", "jobs",
		func(t Tenant) int64 { return t.MaxQueued }, func(n NATS) int64 { return n.JobMaxMsgs }},
	{"max_queued_bytes", "nats.job_max_bytes", job.MaxMessageBytes, "one job's largest message", "bytes",
		func(t Tenant) int64 { return t.MaxQueuedBytes }, func(n NATS) int64 { return n.JobMaxBytes }},
}

// QueueBound is one bound of a tenant's job stream and the setting it comes from.
type QueueBound struct {
	Value   int64  // 0: unbounded
	Unit    string // jobs, bytes
	Setting string // tenants.T.max_queued, or nats.job_max_msgs where the tenant gives none
}

// QueueBounds are the bounds of tenant t's job stream, in jobs then bytes: its max_queued and
// max_queued_bytes where it gives them, else the config's nats.job_max_msgs and
// nats.job_max_bytes (as `worker setup` applies them; c with its defaults).
func (c Config) QueueBounds(tenant string, t Tenant) []QueueBound {
	out := make([]QueueBound, 0, len(queueBounds))
	for _, q := range queueBounds {
		b := QueueBound{Value: q.getNATS(c.NATS), Unit: q.unit, Setting: q.nats}
		if v := q.get(t); v > 0 {
			b.Value, b.Setting = v, "tenants."+tenant+"."+q.key
		}
		out = append(out, b)
	}
	return out
}

func (q queueBound) problem(v int64) string {
	if v < 0 {
		return fmt.Sprintf("%d is negative; give a positive number, or leave it unset for %s", v, q.nats)
	}
	return fmt.Sprintf("%d is below %d, %s; give at least that, or leave it unset for %s", v, q.least, q.what, q.nats)
}

// grantedToAny reports whether a tenant of the tenants: section may run the profile.
func (c Config) grantedToAny(profile string) bool {
	for _, t := range c.Tenants {
		if t.Granted(profile) {
			return true
		}
	}
	return false
}

// validateWarmGranted refuses a warm minimum for a profile no tenant is granted: no job could
// take those sandboxes, and they would hold slots the pools that are used need.
func (c Config) validateWarmGranted(profiles []string) []error {
	if len(c.Tenants) == 0 {
		return nil // the default tenant is granted every profile
	}
	var errs []error
	for _, name := range slices.Sorted(slices.Values(profiles)) {
		w := c.Profiles[name].Warm
		if w == nil || w.Min == 0 || c.grantedToAny(name) {
			continue
		}
		errs = append(errs, &FieldError{Path: "profiles." + name + ".warm.min",
			Msg: fmt.Sprintf("keeps %d sandboxes warm for a profile no tenant is granted; grant it in a tenant's profiles, or set min: 0", w.Min)})
	}
	return errs
}

func (c Config) validateBucket(tenant, bucket string, seen map[string]string) []error {
	if bucket == "" {
		return nil
	}
	field := "tenants." + tenant + ".bucket"
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, &FieldError{Path: field, Msg: fmt.Sprintf(format, args...)})
	}
	switch {
	case !bucketName.MatchString(bucket):
		bad("%q is not an S3 bucket name (3 to 63 of a-z, 0-9, '.', '-')", bucket)
	case c.Store.URL != "" && !strings.HasPrefix(c.Store.URL, "s3://"):
		bad("needs an s3:// store.url; the store is %s", strings.SplitN(c.Store.URL, ":", 2)[0])
	case seen[bucket] != "":
		bad("%q is tenant %s's bucket too; each tenant needs its own", bucket, seen[bucket])
	}
	seen[bucket] = tenant
	return errs
}
