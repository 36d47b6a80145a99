package store_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/boxcar-run/boxcar/internal/spawn"
)

// The S3 tests start HTTP connections and a versitygw process; none may outlive the tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(spawn.StarterFunc))
}
