package runner_test

import (
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/store/storetest"
)

// TestReadOnlyFileStoreWaitsNotReady: a file store whose directory refuses the worker's writes
// (made read-only here: storetest.ReadOnly) refuses every tenant: the job waits
// for the store with its delivery, as for an outage, and runs once the directory takes writes
// again. Before, the tenant's proof of writes met the refusal first and failed the job
// store_write_refused at its first delivery.
func TestReadOnlyFileStoreWaitsNotReady(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := strings.TrimPrefix(b.shared.URL(""), "file://")
	j := b.newJob("p", "t") // its input stored before the directory refuses writes
	lift := storetest.ReadOnly(t, dir)
	b.waitsForTheStore(j, "the store's directory refused the worker's writes", lift)
}
