package provenance_test

import (
	"fmt"
	"testing"

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
