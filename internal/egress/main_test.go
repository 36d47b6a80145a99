package egress

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/boxcar-run/boxcar/internal/spawn"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(spawn.StarterFunc)) }
