package runner

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestLifecycleDocListsEveryPermanentReason holds docs/lifecycle.md's list of the permanent
// faults of a job ("… end it at the attempt that meets them, with one of the reasons
// `invalid_job`, … (every one …") to the reasons the worker ends jobs with (deadLetterReasons, from the failure
// modes), both ways, so that a new failure mode's reason is documented where a team reads
// what its dead letters mean.
func TestLifecycleDocListsEveryPermanentReason(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "lifecycle.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(data)), " ")
	_, list, ok := strings.Cut(text, "end it at the attempt that meets them, with one of the reasons ")
	list, _, ok2 := strings.Cut(list, " (every one")
	if !ok || !ok2 {
		t.Fatal("docs/lifecycle.md lacks its sentence \"Permanent faults of the job end it at the attempt that meets them, with one of the reasons `…`, … (every one …\"")
	}
	var doc []string
	for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(list, -1) {
		doc = append(doc, m[1])
	}
	// Not faults of the job: decide's ends of a job with no reason of its own, and a tenant the
	// workers no longer serve (docs/lifecycle.md's tenants section).
	notFaults := map[string]bool{"failed": true, "rejected": true, "max_deliveries": true, queue.ReasonUnknownTenant: true}
	var code []string
	for r := range deadLetterReasons {
		if !notFaults[r] {
			code = append(code, r)
		}
	}
	slices.Sort(doc)
	slices.Sort(code)
	if !slices.Equal(doc, code) {
		t.Errorf("docs/lifecycle.md lists the permanent faults of a job as\n%v\nthe worker ends jobs with\n%v", doc, code)
	}
}
