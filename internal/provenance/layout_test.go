package provenance

import (
	"testing"

	"github.com/boxcar-run/boxcar/internal/store"
)

// TestLayoutMatchesStore keeps Verify's copy of the run layout in step with internal/store.
func TestLayoutMatchesStore(t *testing.T) {
	const id = "20261202t101500-abcdef012345"
	tests := []struct{ got, want string }{
		{runKey(id, manifestName), store.ManifestKey(id)},
		{runKey(id, signatureName), store.SignatureKey(id)},
		{runKey(id, ""), store.RunPrefix(id)},
		{inputKey("00ff"), store.InputKey("00ff")},
		{SubjectKey(id, Subject{Name: "report.md"}), store.RunPrefix(id) + "report.md"}, // before attempt folders
		{SubjectKey(id, Subject{Name: "report.md", Path: "attempts/2-0a1b2c3d/report.md"}), store.AttemptPrefix(id, "2-0a1b2c3d") + "report.md"},
		{AttemptSignatureKey(id, Statement{Subjects: []Subject{{Name: "report.md", Path: "attempts/2-0a1b2c3d/report.md"}}}), store.AttemptSignatureKey(id, "2-0a1b2c3d")},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("provenance uses %s, store uses %s", tt.got, tt.want)
		}
	}
}
