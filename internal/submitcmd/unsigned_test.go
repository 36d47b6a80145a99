package submitcmd

import (
	"bytes"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/job"
)

// TestStatusSaysTheRunIsUnsigned: a status that marks its committed run unsigned (adopted
// without its signature in place) says so in `submit status`, as text and as JSON; one that
// does not says nothing of a signature.
func TestStatusSaysTheRunIsUnsigned(t *testing.T) {
	t.Parallel()
	for _, unsigned := range []bool{false, true} {
		st := job.Status{ID: "j", State: job.StateSucceeded, Manifest: "s3://b/runs/j/manifest.json", Unsigned: unsigned}
		var text bytes.Buffer
		printStatusLines(&text, st)
		if got := strings.Contains(text.String(), "the run is unsigned"); got != unsigned {
			t.Errorf("unsigned %v: the text says it %v:\n%s", unsigned, got, text.String())
		}
		if got, _ := statusJSON(st)["unsigned"].(bool); got != unsigned {
			t.Errorf("unsigned %v: JSON unsigned %v", unsigned, got)
		}
	}
}
