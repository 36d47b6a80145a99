package runner

import (
	"fmt"
	"testing"

	"github.com/boxcar-run/boxcar/internal/egress"
)

// TestEgressSummaryLineFits: the egress_summary line keeps as many hosts as fit in its room
// and counts the rest, however many hosts the job reached; with no room even for none, there
// is no line.
func TestEgressSummaryLineFits(t *testing.T) {
	t.Parallel()
	hosts := make([]egress.HostSummary, 20000)
	for i := range hosts {
		hosts[i] = egress.HostSummary{Host: fmt.Sprintf("h%05d.example.test", i), Requests: 1}
	}
	for _, tt := range []struct {
		name    string
		hosts   []egress.HostSummary
		room    int64
		dropped bool
	}{
		{"a few hosts", hosts[:3], 16 << 10, false},
		{"20,000 hosts", hosts, 16 << 10, true},
		{"room for no host", hosts, 200, true},
		{"no room", hosts, 20, true},
	} {
		sum := egressSummaryLine{Type: "egress_summary", Time: "2026-12-06T00:00:00Z",
			Summary: egress.Summary{Requests: 5, Hosts: tt.hosts}, DroppedLines: 1010}
		line := fitSummary(&sum, tt.room)
		switch {
		case int64(len(line)) > tt.room:
			t.Errorf("%s: a line of %d bytes in a room of %d", tt.name, len(line), tt.room)
		case line == nil && tt.room >= 200:
			t.Errorf("%s: no line in a room of %d", tt.name, tt.room)
		case line != nil && (sum.HostsDropped > 0) != tt.dropped, line != nil && len(sum.Hosts)+sum.HostsDropped != len(tt.hosts):
			t.Errorf("%s: kept %d hosts, dropped %d, of %d", tt.name, len(sum.Hosts), sum.HostsDropped, len(tt.hosts))
		}
	}
}
