package pool

import (
	"math"
	"time"
)

// mixHalfLife is how fast the profile mix forgets: a job counts half as much after it.
// Long enough that a few seconds of one profile's jobs do not flip a steady mix, short enough
// that a queue that changes profile is followed within a few rounds.
const mixHalfLife = 10 * time.Second

// mixMemory is how long a job counted in its tenant's mix is known as counted: a Take of it
// tried again within it counts nothing more. By then its count weighs under a thousandth.
const mixMemory = 10 * mixHalfLife

// mix is how a tenant's recent jobs split between the worker's profiles: a count of the jobs
// of each, decaying with mixHalfLife. A job counts once, however often its Take is tried (the
// runner tries again while the backend is unavailable; a job whose attempt was cut short may be
// delivered here again): counted at each try, one job that waited for the backend outweighed
// the tenant's others, and its profile's pool took their share of the lag. The jobs stream's subjects name the tenant but not the
// profile, so each warm pool follows its profile's part of the lag of each tenant granted it, as
// that tenant's recent jobs split it, rather than the whole: one profile's burst does not fill
// every warm pool, and one tenant's jobs do not decide how another's lag is read.
type mix struct {
	at      time.Time
	counts  map[string]float64
	counted map[string]bool // the jobs counted within mixMemory, by ID
	order   []countedJob    // the same, oldest first
}

type countedJob struct {
	id string
	at time.Time
}

// add counts the job, of the profile, at now, unless it counted already.
func (m *mix) add(now time.Time, profile, jobID string) {
	m.decay(now)
	if m.counted[jobID] {
		return
	}
	if m.counts == nil {
		m.counts, m.counted = map[string]float64{}, map[string]bool{}
	}
	m.counts[profile]++
	m.counted[jobID] = true
	m.order = append(m.order, countedJob{id: jobID, at: now})
}

// decay brings the counts to now, and forgets the jobs counted mixMemory ago.
func (m *mix) decay(now time.Time) {
	f := math.Exp2(-float64(now.Sub(m.at)) / float64(mixHalfLife))
	for name, c := range m.counts {
		m.counts[name] = c * f
	}
	m.at = now
	n := 0
	for ; n < len(m.order) && now.Sub(m.order[n].at) >= mixMemory; n++ {
		delete(m.counted, m.order[n].id)
	}
	m.order = m.order[n:]
}

// share is the profile's share of the tenant's recent jobs. known is false with less than one
// job's worth left (an idle tenant, or a worker just started): nothing is known of the mix.
func (m *mix) share(now time.Time, profile string) (share float64, known bool) {
	m.decay(now)
	total := 0.0
	for _, c := range m.counts {
		total += c
	}
	if total < 1 {
		return 0, false
	}
	return m.counts[profile] / total, true
}

// part is the profile's part of the pending jobs of the lag read last: a tenant's count only towards the profiles granted to
// it, split between them as its recent jobs were, or whole where nothing is known of its mix.
// The tenants' parts are added before the sum is rounded up: a profile with any part keeps a
// sandbox, but ten tenants with half a job each for it keep five, not ten. The caller holds mu.
func (p *Pool) part(now time.Time, profile string) uint64 {
	sum := 0.0
	for _, l := range p.lags {
		if !p.granted(l.Tenant, profile) {
			continue
		}
		demand := float64(l.Pending)
		if m := p.mixes[l.Tenant]; m != nil {
			if share, known := m.share(now, profile); known {
				demand *= share
			}
		}
		sum += demand
	}
	// Parts that make a whole can add up to a hair over it in floating point (0.2 + 0.4 + 0.3
	// + 0.1 is 1.0000000000000002), which must not round up to one more sandbox.
	return uint64(math.Ceil(max(sum-1e-9, 0)))
}

// granted reports whether the tenant's jobs may ask for the profile (Config.Tenants).
func (p *Pool) granted(tenant, profile string) bool {
	if p.cfg.Tenants == nil {
		return true
	}
	t, ok := p.cfg.Tenants[tenant]
	return ok && t.Granted(profile)
}

// took counts the job, of the profile, towards the tenant's mix. The caller holds mu.
func (p *Pool) took(now time.Time, tenant, profile, jobID string) {
	m := p.mixes[tenant]
	if m == nil {
		m = &mix{}
		p.mixes[tenant] = m
	}
	m.add(now, profile, jobID)
}
