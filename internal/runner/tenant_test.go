package runner_test

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/store"
)

// withTenants gives the bundle's workers the profiles p and q and the tenants section given.
func (b *bundle) withTenants(tenants string) {
	b.t.Helper()
	cfg, err := config.Parse([]byte(profiles + "  q:\n    model: {name: m}\n    tools: [{name: read_file}]\n" + tenants))
	if err != nil {
		b.t.Fatal(err)
	}
	b.cfg = cfg
}

// TestTenantGrants: a job ends at its first attempt when its tenant may not run its profile,
// with the reason in its status, its dead letter and its
// committed manifest; a granted profile runs. The jobs come on the default tenant's subject.
func TestTenantGrants(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, tenants, profile string
		state                  job.State
		reason                 string
		says                   string
		grant                  provenance.Tenant // as the manifest records it
	}{
		{name: "granted", tenants: "tenants:\n  default: {profiles: [p], daily_tokens: 100000, max_concurrent: 3}\n", profile: "p", state: job.StateSucceeded,
			grant: provenance.Tenant{Name: "default", Profiles: []string{"p"}, DailyTokens: 100000, MaxConcurrent: 3}},
		{name: "implicit default tenant", tenants: "", profile: "q", state: job.StateSucceeded,
			grant: provenance.Tenant{Name: "default", Profiles: []string{"p", "q"}, MaxConcurrent: 64}},
		{name: "not granted", tenants: "tenants:\n  default: {profiles: [p]}\n", profile: "q", state: job.StateRejected,
			reason: "profile_not_granted", says: `tenant "default" may run p, not "q"`, grant: provenance.Tenant{Name: "default"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.withTenants(tt.tenants)
			w := b.worker(agentFunc(writeReport))
			j := b.submit(tt.profile)
			st := b.waitFinal(j.ID, 30*time.Second)
			if st.State != tt.state || st.Attempt != 1 || !strings.Contains(st.Error, tt.says) {
				t.Fatalf("status %s at attempt %d, error %q; want %s at attempt 1 saying %q", st.State, st.Attempt, st.Error, tt.state, tt.says)
			}
			m := b.manifest(j.ID).Predicate
			if m.Outcome.Reason != tt.reason {
				t.Errorf("manifest reason %q, want %q", m.Outcome.Reason, tt.reason)
			}
			if !reflect.DeepEqual(m.Tenant, tt.grant) {
				t.Errorf("manifest tenant %+v, want %+v", m.Tenant, tt.grant)
			}
			if tt.reason == "" {
				return
			}
			if started := w.p.started.Load(); started != 0 {
				t.Errorf("%d sandboxes started for a rejected job", started)
			}
			// The status is recorded before the queue is told.
			waitFor(t, 10*time.Second, "the dead letter", func() bool { return len(b.deadLetters()) > 0 })
			dls := b.deadLetters()
			if len(dls) != 1 || dls[0].Reason != tt.reason || dls[0].Attempt != 1 {
				t.Errorf("dead letters %+v, want one with the reason %s at attempt 1", dls, tt.reason)
			}
		})
	}
}

// TestInputOutsideTenant: the worker reads a job's inputs from its tenant's store only; an
// input whose URI names another tenant's object, or an object outside any tenant's folder,
// fails the job at its first attempt as input_outside_tenant, before its sandbox starts, even
// when the object is there with the right bytes. This is the cross-tenant read through the
// worker. (An input at the shared store's root is tenant default's, from before tenants: see
// TestRootInputIsReadFromTheTenantsFolder.)
func TestInputOutsideTenant(t *testing.T) {
	t.Parallel()
	data := []byte("other tenant's secret,1\n")
	sum, size, err := provenance.Digest(strings.NewReader(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		key  string // where the object is, in the shared store
	}{
		{name: "another tenant's input", key: store.TenantPrefix("team-b") + store.InputKey(sum)},
		{name: "another tenant's run", key: store.TenantPrefix("team-b") + store.RunPrefix("20261204t100000-0123456789ab") + "report.md"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			w := b.worker(agentFunc(writeReport))
			ctx := context.Background()
			if err := b.shared.Put(ctx, tt.key, strings.NewReader(string(data)), size); err != nil {
				t.Fatal(err)
			}
			j := job.Job{Version: job.Version, ID: job.NewID(), Profile: "p", Task: "t", SubmittedAt: time.Now().UTC(),
				Inputs: []job.Input{{Name: "in.csv", URI: b.shared.URL(tt.key), SHA256: sum, Size: size}}}
			b.publish(j)
			st := b.waitFinal(j.ID, 30*time.Second)
			if st.State != job.StateFailed || st.Attempt != 1 || !strings.Contains(st.Error, "outside the store of tenant default") {
				t.Fatalf("status %s at attempt %d, error %q; want failed at attempt 1, outside the tenant", st.State, st.Attempt, st.Error)
			}
			waitFor(t, 10*time.Second, "the dead letter", func() bool { return len(b.deadLetters()) > 0 })
			if dls := b.deadLetters(); len(dls) != 1 || dls[0].Reason != "input_outside_tenant" {
				t.Errorf("dead letters %+v, want one input_outside_tenant", dls)
			}
			if n := w.p.started.Load(); n != 0 {
				t.Errorf("%d sandboxes started; the input must be refused before", n)
			}
		})
	}
}

// TestInputFromAnotherMountOfTheFileStore: submit and the worker may see one file store at
// different paths (a container's volume); an input named by its key under the tenant's folder
// is the tenant's, whatever the path before it.
func TestInputFromAnotherMountOfTheFileStore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(agentFunc(writeReport))
	in := b.putTenantInput(b.store, []byte("a,b\n1,2\n"))
	in.URI = "file:///mnt/elsewhere/" + store.TenantPrefix(job.DefaultTenant) + store.InputKey(in.SHA256)
	j := job.Job{Version: job.Version, ID: job.NewID(), Profile: "p", Task: "t", SubmittedAt: time.Now().UTC(), Inputs: []job.Input{in}}
	b.publish(j)
	if st := b.waitFinal(j.ID, 30*time.Second); st.State != job.StateSucceeded {
		t.Fatalf("status %s, error %q; want succeeded", st.State, st.Error)
	}
}
