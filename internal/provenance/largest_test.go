package provenance_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/provenance"
)

// TestParseTakesEveryRunAWorkerWrites: a manifest Build makes of a run a worker may run is
// read back, however many hosts the job's network reached: a job reaches as many hosts as its
// egress' max_requests, which config bounds only below (10,000 by default), and each host is a
// record of its own (on main, counted as five values against the 65,536 outside the capped
// lists: 14,000 hosts and every reader, the worker's adoption too, refused the run). Build
// names the first MaxEgressHosts by name and counts the rest (hosts_dropped).
func TestParseTakesEveryRunAWorkerWrites(t *testing.T) {
	for _, hosts := range []int{10_000, 14_000, 100_000} {
		t.Run(fmt.Sprintf("%d hosts", hosts), func(t *testing.T) {
			m := sampleManifest(t)
			m.Egress = &provenance.Egress{Requests: int64(hosts)}
			for i := range hosts {
				m.Egress.Hosts = append(m.Egress.Hosts, provenance.EgressHost{Host: fmt.Sprintf("h%d.files.example.com", i), Requests: 1, BytesOut: 1})
			}
			st, err := provenance.Parse(build(t, m, sampleSubjects()))
			if err != nil {
				t.Fatalf("Parse of a run that reached %d hosts: %v", hosts, err)
			}
			e := st.Predicate.Egress
			if kept := min(hosts, provenance.MaxEgressHosts); len(e.Hosts) != kept || e.HostsDropped != hosts-kept || e.Requests != int64(hosts) {
				t.Errorf("%d hosts named, %d dropped, %d requests; want %d, %d, %d", len(e.Hosts), e.HostsDropped, e.Requests, kept, hosts-kept, hosts)
			}
		})
	}
}

// TestParseTakesADeepToolSchema: a profile's tool schema nests as deep as config takes it
// (config.Validate sets no bound), and the manifest of its run holds it in the profile's
// spec, seven levels down: every manifest Build writes, up to the deepest its canonical JSON
// follows, is read back. On main a reader refused one past 64 levels in all, a schema of 28
// nested objects, which the worker ran and committed.
func TestParseTakesADeepToolSchema(t *testing.T) {
	cfg, err := config.Parse(examples.Config)
	if err != nil {
		t.Fatal(err)
	}
	built := 0
	for levels := 1; ; levels++ {
		data, err := provenance.Build(deepSchemaRun(t, cfg, levels), sampleSubjects())
		if err != nil {
			break // past what Build writes
		}
		built = levels
		if _, err := provenance.Parse(data); err != nil {
			t.Fatalf("Parse of a run whose tool schema nests %d objects: %v", levels, err)
		}
	}
	if built < 28 {
		t.Fatalf("Build wrote a schema of at most %d nested objects; the test wants 28 or more", built)
	}
}

// deepSchemaRun is sampleManifest's run of a profile whose csv_stats schema has a parameter
// of levels nested objects, a profile config takes.
func deepSchemaRun(t *testing.T, cfg config.Config, levels int) provenance.Manifest {
	t.Helper()
	var schema any = map[string]any{"type": "string"}
	for range levels {
		schema = map[string]any{"type": "object", "properties": map[string]any{"a": schema}}
	}
	p := cfg.Profiles["csv-analyst"]
	p.Tools = slices.Clone(p.Tools)
	i := slices.IndexFunc(p.Tools, func(t config.Tool) bool { return t.Name == "csv_stats" })
	p.Tools[i].Parameters = maps.Clone(p.Tools[i].Parameters)
	props := maps.Clone(p.Tools[i].Parameters["properties"].(map[string]any))
	props["deep"] = schema
	p.Tools[i].Parameters["properties"] = props
	cfg.Profiles = maps.Clone(cfg.Profiles)
	cfg.Profiles["csv-analyst"] = p
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config refuses a schema of %d nested objects: %v; the row is no run a worker may run", levels, err)
	}
	m := sampleManifest(t)
	var err error
	if m.Profile.Spec, err = cfg.Profile("csv-analyst"); err != nil {
		t.Fatal(err)
	}
	return m
}
