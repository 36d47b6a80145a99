package pool

import (
	"math"
	"time"
)

// mixHalfLife is how fast the profile mix forgets: a take counts half as much after it.
// Long enough that a few seconds of one profile's jobs do not flip a steady mix, short enough
// that a queue that changes profile is followed within a few rounds.
const mixHalfLife = 10 * time.Second

// mix is how the recent jobs split between the worker's profiles: a count of the takes of each,
// decaying with mixHalfLife. The jobs stream's subjects name no profile, so the lag is the
// whole consumer's; each warm pool follows its profile's part of it, as the recent jobs split
// it, rather than the whole, so that one profile's burst does not fill every warm pool.
type mix struct {
	at     time.Time
	counts map[string]float64
}

// add counts one take of the profile at now.
func (m *mix) add(now time.Time, profile string) {
	m.decay(now)
	if m.counts == nil {
		m.counts = map[string]float64{}
	}
	m.counts[profile]++
}

func (m *mix) decay(now time.Time) {
	f := math.Exp2(-float64(now.Sub(m.at)) / float64(mixHalfLife))
	for name, c := range m.counts {
		m.counts[name] = c * f
	}
	m.at = now
}

// part is the profile's part of demand: demand times the profile's share of the recent takes,
// rounded up, so a profile with any recent job keeps at least one. With less than one take's
// worth left (an idle worker, or one just started) nothing is known of the mix, and every
// profile's part is the whole demand.
func (m *mix) part(now time.Time, profile string, demand uint64) uint64 {
	m.decay(now)
	total := 0.0
	for _, c := range m.counts {
		total += c
	}
	if total < 1 {
		return demand
	}
	return uint64(math.Ceil(float64(demand) * m.counts[profile] / total))
}
