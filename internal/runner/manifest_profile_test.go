package runner_test

import (
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
)

// TestManifestRecordsEachJobsLimits: a worker encodes a profile's spec once for the manifests
// of its jobs, and a job that tightens its limits runs under a spec of its own. Each manifest
// records the limits of its own job, in the spec and beside it, and the digest of that spec,
// whichever job of the profile committed before it.
func TestManifestRecordsEachJobsLimits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.worker(agentFunc(writeReport))
	defer w.stop()
	for i, limits := range []*job.Limits{{MaxTurns: 3}, nil, nil, {MaxTurns: 2}, {MaxTurns: 2}, nil} {
		j := b.newJob("p", "t")
		j.Limits = limits
		b.publish(j)
		if st := b.waitFinal(j.ID, 20*time.Second); st.State != job.StateSucceeded {
			t.Fatalf("job %d: status = %+v, want succeeded", i, st)
		}
		m := b.manifest(j.ID).Predicate
		want := b.cfg.Profiles["p"].Limits.Tighten(limits).MaxTurns
		digest, err := provenance.ProfileDigest(m.Profile.Spec)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case m.Profile.Spec.Limits.MaxTurns != want || m.Limits.MaxTurns != want:
			t.Errorf("job %d (limits %+v): the manifest's profile has max_turns %d and its limits %d, want %d",
				i, limits, m.Profile.Spec.Limits.MaxTurns, m.Limits.MaxTurns, want)
		case m.Profile.Digest != digest:
			t.Errorf("job %d: profile.digest %s is not the digest of the spec the manifest records, %s", i, m.Profile.Digest, digest)
		}
	}
}
