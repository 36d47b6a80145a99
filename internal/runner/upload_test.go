package runner_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/store"
)

// unsafeOnce refuses the first create-only put of a manifest as a store whose server stopped
// refusing overwrites does (store.ErrUnsafeServer), writing nothing: the runner then waits and
// commits again, from scratch, into a new attempt folder.
type unsafeOnce struct {
	store.Store
	refused atomic.Bool
}

func (s *unsafeOnce) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	if strings.HasSuffix(key, "/manifest.json") && s.refused.CompareAndSwap(false, true) {
		return fmt.Errorf("store: put-if-absent %s: %w", key, store.ErrUnsafeServer)
	}
	return s.Store.PutIfAbsent(ctx, key, r, size)
}

// TestUploadStreamsAndLeavesOutChangedArtifacts: artifacts go from the sandbox to the store as
// streams, each read again on each try of the commit, and one that does not read as it was
// listed (shorter, longer, failing midway) is left out and named once in the manifest, even
// when the commit is tried twice; nothing half read is stored. The transcript is the one the
// agent wrote to its spool, which leaves nothing in the temporary folder.
func TestUploadStreamsAndLeavesOutChangedArtifacts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	files := map[string]string{
		"artifacts/ok.csv":      "a,b\n1,2\n",
		"artifacts/shrinks.bin": "0123456789",
		"artifacts/grows.bin":   "0123456789",
		"artifacts/fails.bin":   "0123456789",
	}
	var mu sync.Mutex
	opened := map[string]int{}
	p := &fakeProvider{reads: func(_ context.Context, name string, data []byte) io.Reader {
		mu.Lock()
		opened[name]++
		mu.Unlock()
		switch name {
		case "artifacts/shrinks.bin":
			return bytes.NewReader(data[:5])
		case "artifacts/grows.bin":
			return io.MultiReader(bytes.NewReader(data), strings.NewReader("more"))
		case "artifacts/fails.bin":
			return io.MultiReader(bytes.NewReader(data[:3]), iotest.ErrReader(errors.New("exec stream reset")))
		}
		return bytes.NewReader(data)
	}}
	const line = `{"type":"final","message":"spooled"}` + "\n"
	a := agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		for name, data := range files {
			if err := req.Sandbox.WriteFile(ctx, name, []byte(data)); err != nil {
				return agent.Result{}, err
			}
		}
		if err := req.Sandbox.WriteFile(ctx, "report.md", []byte("# done\n")); err != nil {
			return agent.Result{}, err
		}
		if _, err := io.WriteString(req.Transcript, line); err != nil {
			return agent.Result{}, err
		}
		return agent.Result{Outcome: agent.OutcomeCompleted}, nil
	})
	st := &unsafeOnce{Store: b.shared}
	tmp := t.TempDir()
	b.worker(a, func(c *runner.Config) { c.Sandboxes, c.Store, c.TempDir = p, st, tmp })
	j := b.submit("p")
	if s := b.waitFinal(j.ID, time.Minute); s.State != job.StateSucceeded {
		t.Fatalf("status = %+v, want succeeded", s)
	}
	if !st.refused.Load() {
		t.Fatal("the first manifest put was not refused; the commit was tried once")
	}

	m := b.manifest(j.ID)
	var names []string
	for _, s := range m.Subjects {
		names = append(names, s.Name)
	}
	if want := []string{"artifacts/ok.csv", "report.md", "transcript.jsonl"}; !slices.Equal(names, want) {
		t.Errorf("subjects = %q, want %q, each once", names, want)
	}
	var skipped []string
	for _, s := range m.Predicate.Collected.Skipped {
		skipped = append(skipped, s.Path+":"+s.Reason)
	}
	if want := []string{"artifacts/fails.bin:changed", "artifacts/grows.bin:changed", "artifacts/shrinks.bin:changed"}; !slices.Equal(skipped, want) {
		t.Errorf("left out = %q, want %q, each once", skipped, want)
	}
	for name, n := range opened {
		if n != 2 {
			t.Errorf("%s opened %d times, want twice: once per try of the commit", name, n)
		}
	}
	if got := string(b.runFile(j.ID, "transcript.jsonl")); got != line {
		t.Errorf("transcript.jsonl = %q, want what the agent wrote, %q", got, line)
	}
	if report, err := provenance.Verify(t.Context(), b.store, j.ID, nil); err != nil || !report.OK() {
		t.Errorf("verify: %v %+v", err, report.Checks)
	}
	// The first try's objects were removed, and no try stored any part of a changed artifact.
	objs, err := b.store.List(t.Context(), store.RunPrefix(j.ID)+"attempts/")
	if err != nil {
		t.Fatal(err)
	}
	folders := map[string]bool{}
	for _, o := range objs {
		k := o.Key
		folders[strings.SplitN(strings.TrimPrefix(k, store.RunPrefix(j.ID)+"attempts/"), "/", 2)[0]] = true
		if strings.Contains(k, "shrinks") || strings.Contains(k, "grows") || strings.Contains(k, "fails") {
			t.Errorf("stored %s, an artifact that changed while it was uploaded", k)
		}
	}
	if len(folders) != 1 {
		t.Errorf("attempt folders = %v, want only the one that committed", folders)
	}
	if left, err := os.ReadDir(tmp); err != nil || len(left) != 0 {
		t.Errorf("temporary folder holds %v (%v), want nothing: the spool is unlinked", left, err)
	}
}

// TestSummaryCountsArtifactsLeftOutAtUpload: the worker's summary report says how many
// artifacts were left out as the manifest names them, those the upload leaves out (one that
// changed after it was listed) as well as those left out when the artifacts were listed (a
// name the store cannot hold), on every try of the commit.
func TestSummaryCountsArtifactsLeftOutAtUpload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := &fakeProvider{reads: func(_ context.Context, name string, data []byte) io.Reader {
		if name == "artifacts/shrinks.bin" {
			return bytes.NewReader(data[:5])
		}
		return bytes.NewReader(data)
	}}
	a := agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		for _, name := range []string{"artifacts/ok.csv", "artifacts/shrinks.bin", "artifacts/.boxcar-tmp-x"} {
			if err := req.Sandbox.WriteFile(ctx, name, []byte("0123456789")); err != nil {
				return agent.Result{}, err
			}
		}
		// Capped, so report.md is the worker's summary.
		return agent.Result{Outcome: agent.OutcomeCapped, Cap: agent.CapMaxTurns}, nil
	})
	st := &unsafeOnce{Store: b.shared}
	b.worker(a, func(c *runner.Config) { c.Sandboxes, c.Store = p, st })
	j := b.submit("p")
	if s := b.waitFinal(j.ID, time.Minute); s.State != job.StateCapped {
		t.Fatalf("status = %+v, want capped", s)
	}
	if !st.refused.Load() {
		t.Fatal("the first manifest put was not refused; the commit was tried once")
	}
	m := b.manifest(j.ID)
	var skipped []string
	for _, s := range m.Predicate.Collected.Skipped {
		skipped = append(skipped, s.Path+":"+s.Reason)
	}
	if want := []string{"artifacts/.boxcar-tmp-x:bad_name", "artifacts/shrinks.bin:changed"}; !slices.Equal(skipped, want) || m.Predicate.Collected.SkippedMore != 0 {
		t.Fatalf("left out = %q and %d more, want %q", skipped, m.Predicate.Collected.SkippedMore, want)
	}
	report := string(b.runFile(j.ID, "report.md"))
	if want := "\n2 artifact files or folders were left out;"; !strings.Contains(report, want) {
		t.Errorf("report.md does not say %q, as many as the manifest names:\n%s", want, report)
	}
	if r, err := provenance.Verify(t.Context(), b.store, j.ID, nil); err != nil || !r.OK() {
		t.Errorf("verify: %v %+v", err, r.Checks)
	}
}
