package submitcmd

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestProfileNotGranted: with a worker that grants csv-analyst only to team-b, `submit
// profiles` (acting for the default tenant) lists nothing, and `submit run` refuses the
// profile as not granted, exit 4 like an unknown profile, before anything reaches the store or
// the stream; granted to the default tenant, the same run goes through.
func TestProfileNotGranted(t *testing.T) {
	tests := []struct {
		name    string
		tenants string
		listed  bool
		refused bool
	}{
		{name: "granted to another tenant", tenants: "tenants:\n  team-b: {profiles: [csv-analyst]}\n", refused: true},
		{name: "granted", tenants: "tenants:\n  default: {profiles: [csv-analyst]}\n  team-b: {profiles: [csv-analyst]}\n", listed: true},
		{name: "no tenants section", listed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			te := newTestEnv(t)
			te.advertiseWith(t, tt.tenants)
			stdout, _, err := te.submit(t, "profiles")
			if err != nil || strings.Contains(stdout, "csv-analyst") != tt.listed {
				t.Errorf("profiles: %v\n%s\nwant csv-analyst listed: %v", err, stdout, tt.listed)
			}
			before := te.jobMessages(t)
			input := writeTestFile(t, t.TempDir(), "in.csv", "a,b\n")
			_, stderr, err := te.submit(t, "run", "--profile", "csv-analyst", "--task", "t", "--input", input, "-o", "json")
			if !tt.refused {
				if err != nil || te.jobMessages(t) != before+1 {
					t.Fatalf("run: %v\n%s", err, stderr)
				}
				return
			}
			var e struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			}
			if jerr := json.Unmarshal([]byte(stderr), &e); jerr != nil || exitCode(err) != exitRejected || e.Code != codeNotGranted ||
				!strings.Contains(e.Message, `"csv-analyst" is not granted to tenant default; it may run none`) {
				t.Errorf("run: exit %d, %q; want exit %d, code %s", exitCode(err), stderr, exitRejected, codeNotGranted)
			}
			if keys := listKeys(t, te.st, "inputs/"); len(keys) != 0 || te.jobMessages(t) != before {
				t.Errorf("a profile not granted still uploaded %v or queued a job", keys)
			}
		})
	}
}
