package store_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The S3 tests start HTTP connections and a versitygw process; none may outlive the tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
