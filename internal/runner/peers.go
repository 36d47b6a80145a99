package runner

import (
	"context"
	"fmt"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// A fleet whose config is rolled out runs two configs for a while: a job that `submit run`
// let through because a live worker defines its profile may reach one that does not. What such
// a worker decides from its own config alone is no fault of the job, so it leaves the job to
// the worker that can take it: it hands the delivery back, recording no failure, while a live
// worker's published profiles (queue.ProfilesBucket) could take it. Each hand-back waits the
// retry backoff, doubling, as a transient fault does, and is counted in the job's status
// (HandedBack): it does not count against the max_deliver that bounds the job's runs, and the
// hand-backs are bounded by it on their own: the max_deliver'th refusal ends the job as this
// worker decides, so a job that no worker can take, or one that only workers lacking its
// profile keep picking up, still ends, with one dead letter.

// peerTakes are the ends decided from a worker's own config, by their dead letter's reason,
// each with whether a live worker's published profile (of the job's name) could take the job.
var peerTakes = map[string]func(a *attempt, p queue.ProfileInfo) bool{
	"unknown_profile":     grantsTenant,
	"profile_not_granted": grantsTenant,
	// The hosts are not published; a profile whose allow list differs from this worker's may
	// allow the job's.
	"network_not_allowed": func(a *attempt, p queue.ProfileInfo) bool {
		return grantsTenant(a, p) && p.Network != "" && p.Network != queue.NetworkDigest(a.profile)
	},
	"input_too_large": func(a *attempt, p queue.ProfileInfo) bool {
		return grantsTenant(a, p) && p.MaxInputBytes >= inputBytes(a.job)
	},
}

func grantsTenant(a *attempt, p queue.ProfileInfo) bool { return p.GrantedTo(a.tenant) }

// peerLookup bounds reading the live workers' profiles: NATS that does not answer leaves the
// job to end as this worker decides.
const peerLookup = 5 * time.Second

// spareHandBacks tells the delivery how many of the job's deliveries before it were handed to
// a peer (job.Status.HandedBack): those met no fault and ran nothing, and do not count against
// the max_deliver that bounds the job's runs. Otherwise a job that workers lacking its profile
// handed back a few times during a rollout got fewer runs than max_deliver, or none: its first
// transient fault on the worker that could take it ended it dead (max_deliveries). A first
// delivery has none; a status NATS does not give within peerLookup counts none, as before.
func (r *Runner) spareHandBacks(ctx context.Context, a *attempt) {
	if a.d.Attempt == 1 || !job.ValidID(a.d.JobID) {
		return
	}
	lookup, cancel := context.WithTimeout(ctx, peerLookup)
	defer cancel()
	if st, err := r.cfg.Queue.Status(lookup, a.ref(a.d.JobID)); err == nil {
		a.d.Spared = min(st.HandedBack, a.d.Attempt-1)
	}
}

// leaveToPeer turns an end of admit that this worker's config decided (peerTakes) into a
// hand-back when a live worker could take the job and the job has a hand-back left. Any
// other outcome it returns as it is.
func (r *Runner) leaveToPeer(ctx context.Context, a *attempt, o outcome) outcome {
	takes, ok := peerTakes[permanentReason(o.err, "")]
	if !ok || (o.end != endRejected && o.end != endFailed) || a.d.Spared+1 >= r.cfg.Worker.NATS.MaxDeliver {
		// The last hand-back a job may have: hand-backs do not count against the
		// max_deliver that bounds its runs (spareHandBacks), so they are bounded on their own.
		return o
	}
	lookup, cancel := context.WithTimeout(ctx, peerLookup)
	defer cancel()
	live, err := r.cfg.Queue.LiveProfiles(lookup)
	if err != nil {
		return o
	}
	for _, w := range live {
		for _, p := range w.Profiles {
			if p.Name == a.job.Profile && takes(a, p) {
				return outcome{end: endLeftToPeer, err: fmt.Errorf("live worker %s defines profile %s otherwise; left to a worker that can take the job: %w", w.Worker, p.Name, o.err)}
			}
		}
	}
	return o
}
