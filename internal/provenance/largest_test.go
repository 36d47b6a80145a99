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

// TestParseTakesTheLargestProfileConfigTakes: a profile goes whole into its runs' manifests,
// and config bounds how many values it holds and how deep it nests (config.MaxProfileValues,
// MaxProfileDepth): a run of the largest and of the deepest profile config takes is built and
// read back. Config set no bound before: a schema of 28 nested objects, or an enum of 70,000
// values, passed Validate and Build, and every reader refused the run's manifest.
func TestParseTakesTheLargestProfileConfigTakes(t *testing.T) {
	cfg, err := config.Parse(examples.Config)
	if err != nil {
		t.Fatal(err)
	}
	deepest := 0
	for levels := 1; ; levels++ {
		var schema any = map[string]any{"type": "string"}
		for range levels {
			schema = map[string]any{"type": "object", "properties": map[string]any{"a": schema}}
		}
		m, ok := schemaRun(t, cfg, schema)
		if !ok {
			break
		}
		deepest = levels
		if _, err := provenance.Parse(build(t, m, sampleSubjects())); err != nil {
			t.Fatalf("Parse of a run whose tool schema nests %d objects: %v", levels, err)
		}
	}
	largest := 0
	for n := config.MaxProfileValues; n > 0 && largest == 0; n -= 64 {
		m, ok := schemaRun(t, cfg, map[string]any{"enum": make([]any, n)})
		if !ok {
			continue
		}
		largest = n
		if _, err := provenance.Parse(build(t, m, sampleSubjects())); err != nil {
			t.Fatalf("Parse of a run whose tool schema has an enum of %d values: %v", n, err)
		}
	}
	if deepest < 20 || largest < config.MaxProfileValues/2 {
		t.Fatalf("config took a schema of at most %d nested objects and an enum of %d values; the test wants 20 and %d", deepest, largest, config.MaxProfileValues/2)
	}
}

// schemaRun is sampleManifest's run of a profile whose csv_stats tool has a parameter of
// schema, and whether config takes that profile.
func schemaRun(t *testing.T, cfg config.Config, schema any) (provenance.Manifest, bool) {
	t.Helper()
	p := cfg.Profiles["csv-analyst"]
	p.Tools = slices.Clone(p.Tools)
	i := slices.IndexFunc(p.Tools, func(t config.Tool) bool { return t.Name == "csv_stats" })
	p.Tools[i].Parameters = maps.Clone(p.Tools[i].Parameters)
	props := maps.Clone(p.Tools[i].Parameters["properties"].(map[string]any))
	props["large"] = schema
	p.Tools[i].Parameters["properties"] = props
	cfg.Profiles = maps.Clone(cfg.Profiles)
	cfg.Profiles["csv-analyst"] = p
	if err := cfg.Validate(); err != nil {
		return provenance.Manifest{}, false
	}
	m := sampleManifest(t)
	var err error
	if m.Profile.Spec, err = cfg.Profile("csv-analyst"); err != nil {
		t.Fatal(err)
	}
	return m, true
}
