package runner_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/test/harness"
)

// answerLostStore loses the answer to the first create-only put of a key ending in suffix:
// with taken, the store takes the put and the worker hears errStoreDown (a timeout, a 503 from
// a proxy); without, the put is sent but lands only later, just before the next create-only
// put of that key reaches the store (a request still on its way when its answer was given
// up).
type answerLostStore struct {
	store.Store
	suffix string
	taken  bool
	// refuseRetry: the put that follows the lost one, before that one lands, is answered with
	// a refusal that took nothing (the worker's token expired meanwhile).
	refuseRetry bool
	refused     bool

	mu      sync.Mutex
	lost    int
	pending func() // the late landing of the put the store has not taken yet
}

func (s *answerLostStore) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	if !strings.HasSuffix(key, s.suffix) {
		return s.Store.PutIfAbsent(ctx, key, r, size)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending != nil && s.refuseRetry && !s.refused {
		s.refused = true
		_, _ = io.Copy(io.Discard, r)
		return fmt.Errorf("store: put-if-absent %s: api error ExpiredToken: %w", key, store.ErrWorkerRefused)
	}
	if s.pending != nil {
		s.pending()
		s.pending = nil
	}
	if s.lost > 0 {
		return s.Store.PutIfAbsent(ctx, key, r, size)
	}
	s.lost++
	body, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	land := func() { _ = s.Store.PutIfAbsent(context.WithoutCancel(ctx), key, bytes.NewReader(body), size) }
	if s.taken {
		land()
	} else {
		s.pending = land
	}
	return errStoreDown
}

// TestCommitKeepsARunWhosePutAnswerWasLost: a create-only put of the commit is taken, or is
// on its way, when its answer is lost. The worker finds out what is stored before it removes
// anything: its own object is a put that took, and the run it committed keeps every object
// its manifest names, its signature, and nothing beside. A manifest put again over its own
// used to read as another attempt's commit (errLeaseLost), and the commit removed the run
// that manifest names; a report put again got ErrExists for its own bytes. The failed job's
// row is the manifest of an end without a run (commitEnd).
func TestCommitKeepsARunWhosePutAnswerWasLost(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		suffix string
		taken  bool
		// fails: the job's input is missing, so it ends failed before its agent runs.
		fails bool
		// refuseRetry: the put again of the lost one is answered with a refusal that took
		// nothing, which says nothing of the lost put still on its way.
		refuseRetry bool
	}{
		{name: "manifest taken", suffix: "/manifest.json", taken: true},
		{name: "manifest landing after its retry", suffix: "/manifest.json"},
		{name: "manifest landing after a retry the store refused", suffix: "/manifest.json", refuseRetry: true},
		{name: "failed end's manifest taken", suffix: "/manifest.json", taken: true, fails: true},
		{name: "failed end's manifest landing after its retry", suffix: "/manifest.json", fails: true},
		{name: "report taken", suffix: "/report.md", taken: true},
		{name: "report landing after its retry", suffix: "/report.md"},
		{name: "signatures taken", suffix: "/manifest.dsse.json", taken: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			oneDelivery(b)
			priv, pub := signingKeys(t)
			lossy := &answerLostStore{Store: b.shared, suffix: tt.suffix, taken: tt.taken, refuseRetry: tt.refuseRetry}
			b.worker(agentFunc(writeReport), func(c *runner.Config) { c.Store, c.SigningKey = lossy, priv })
			j := b.newJob("p", "t")
			want := job.StateSucceeded
			if tt.fails {
				sum, size, _ := provenance.Digest(strings.NewReader("never stored"))
				j.Inputs = []job.Input{{Name: "in.csv", URI: b.store.URL(store.InputKey(sum)), SHA256: sum, Size: size}}
				want = job.StateFailed
			}
			b.publish(j)
			st := b.waitFinal(j.ID, 30*time.Second)
			if st.State != want || st.Attempt != 1 {
				t.Errorf("status %s on attempt %d (%s), want %s on attempt 1", st.State, st.Attempt, st.Error, want)
			}
			lossy.mu.Lock()
			if lossy.lost != 1 {
				t.Errorf("%d answers lost, want 1", lossy.lost)
			}
			lossy.mu.Unlock()
			report, _ := provenance.Verify(context.Background(), b.store, j.ID, pub)
			if len(report.Checks) == 0 {
				t.Fatal("verify made no checks")
			}
			for _, c := range report.Checks {
				// The failed job's input is missing by design; everything of the run is there.
				if !c.OK && (!tt.fails || !strings.HasPrefix(c.Name, "input ")) {
					t.Errorf("verify: %s: %s", c.Name, c.Reason)
				}
			}
			if unlisted, err := provenance.Unlisted(context.Background(), b.store, j.ID, report.Statement); err != nil || len(unlisted) != 0 {
				t.Errorf("objects the manifest does not name: %q, %v; want none", unlisted, err)
			}
		})
	}
}

// TestAnotherTenantsRunIsNotAdopted: a worker-signed run of tenant alpha's, copied with its
// attempt's envelope into tenant default's folder under a job of default's (by anyone who can
// write there), is no run of that job: the worker neither ends the job as it says nor
// restores its signature into place. It used to check neither the tenant nor the job id of
// the manifest it adopted.
func TestAnotherTenantsRunIsNotAdopted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	priv, _ := signingKeys(t)
	j := b.newJob("p", "t")
	const folder = "1-a1fa0000"
	report := []byte("# alpha's report\n")
	sum := sha256.Sum256(report)
	manifest, err := provenance.Build(provenance.Manifest{
		Job:     provenance.Job{ID: j.ID, Profile: "p", Task: "t"},
		Outcome: provenance.Outcome{State: job.StateSucceeded},
		Tenant:  provenance.Tenant{Name: "alpha", Profiles: []string{"p"}},
	}, []provenance.Subject{{Name: "report.md", Path: "attempts/" + folder + "/report.md", SHA256: hex.EncodeToString(sum[:]), Size: int64(len(report))}})
	if err != nil {
		t.Fatal(err)
	}
	env, err := provenance.Sign(ctx, manifest, priv)
	if err != nil {
		t.Fatal(err)
	}
	for key, data := range map[string][]byte{
		store.AttemptPrefix(j.ID, folder) + "report.md": report,
		store.AttemptSignatureKey(j.ID, folder):         env,
		store.ManifestKey(j.ID):                         manifest,
	} {
		if err := b.store.PutIfAbsent(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
			t.Fatal(err)
		}
	}
	var logs harness.LogBuffer
	b.worker(agentFunc(writeReport), func(c *runner.Config) {
		c.SigningKey = priv
		c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	b.publish(j)
	waitFor(t, 15*time.Second, "the worker to refuse the manifest or end the job", func() bool {
		st, err := b.q.Status(ctx, j.ID)
		return strings.Contains(logs.String(), "it records a job of tenant alpha, not of default") || err == nil && st.State.Terminal()
	})
	if st, err := b.q.Status(ctx, j.ID); err == nil && st.State.Terminal() {
		t.Errorf("the job ended %s, as tenant alpha's manifest says: %+v", st.State, st)
	}
	if _, err := b.store.Stat(ctx, store.SignatureKey(j.ID)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the signature of tenant alpha's run was put in place (%v), want none", err)
	}
}

// refusedAfterLostStore takes the first create-only put of the job's manifest and loses its
// answer; then the tenant's folder refuses the worker's writes (a policy revoked meanwhile)
// and its reads of the manifest go unanswered, so the worker cannot tell whether the lost put
// took, until the attempt's deadline. Reads answer again from the first put of the end the
// worker decided after it (a manifest that is not the run's).
type refusedAfterLostStore struct {
	store.Store
	mu      sync.Mutex
	run     []byte // the run's manifest, taken with its answer lost
	healed  bool
	refused int
}

func (s *refusedAfterLostStore) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	if !strings.HasSuffix(key, "/manifest.json") {
		return s.Store.PutIfAbsent(ctx, key, r, size)
	}
	body, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.run == nil {
		s.run = body
		if err := s.Store.PutIfAbsent(ctx, key, bytes.NewReader(body), size); err != nil {
			return err
		}
		return errStoreDown
	}
	if !bytes.Equal(body, s.run) {
		s.healed = true
	}
	s.refused++
	return fmt.Errorf("store: put-if-absent %s: api error AccessDenied: Access Denied: %w", key, store.ErrWriteRefused)
}

func (s *refusedAfterLostStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	s.mu.Lock()
	down := s.run != nil && !s.healed && strings.HasSuffix(key, "/manifest.json")
	s.mu.Unlock()
	if down {
		return nil, errStoreDown
	}
	return s.Store.Get(ctx, key)
}

// TestLastDeliveryAdoptsARunWhosePutAnswerWasLostThenRefused: on a job's last delivery, the
// manifest's put took but its answer was lost, and each put again was refused (the folder's
// policy revoked meanwhile) with no read back to tell, until the attempt's deadline. The run
// is committed, and the job ends as it says: succeeded, with no dead letter. The delivery took
// the refusal, kept with "may be stored", for the store refusing the job's every write, and
// ended the job dead without trying its end at all, beside the committed succeeded manifest.
func TestLastDeliveryAdoptsARunWhosePutAnswerWasLostThenRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	oneDelivery(b)
	p := b.cfg.Profiles["p"]
	p.Limits.JobTimeout = config.Duration(time.Second) // the attempt's waits give up after 2 s
	b.cfg.Profiles = map[string]config.Profile{"p": p}
	st := &refusedAfterLostStore{Store: b.shared}
	b.worker(agentFunc(writeReport), func(c *runner.Config) { c.Store = st })
	j := b.newJob("p", "t")
	b.publish(j)
	final := b.waitFinal(j.ID, 60*time.Second)
	st.mu.Lock()
	refused := st.refused
	st.mu.Unlock()
	if refused == 0 {
		t.Fatal("no put again was refused: the test did not reach its case")
	}
	if m := b.manifest(j.ID); final.State != job.StateSucceeded || m.Predicate.Outcome.State != job.StateSucceeded {
		t.Errorf("status %s (%s), manifest %s; want both succeeded", final.State, final.Error, m.Predicate.Outcome.State)
	}
	for _, dl := range b.deadLetters() {
		if dl.JobID == j.ID {
			t.Errorf("dead letter %s beside the committed run", dl.Reason)
		}
	}
}
