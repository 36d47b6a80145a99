package submitcmd

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"

	"github.com/boxcar-run/boxcar/internal/provenance"
)

// minKeepFree is the least free space a copy of a run's files leaves on the file system it
// writes to.
const minKeepFree = 64 << 20

// errNoRoom marks a copy refused because the sizes a manifest records do not fit.
var errNoRoom = errors.New("not enough free space")

// roomFor returns nil when the file system that holds dir (or would: its nearest folder that
// is there) has room for need bytes and keeps a tenth of its free space, and minKeepFree, free
// after them. get and logs copy what a manifest names at the sizes it records before they
// check a byte, and a manifest nothing vouches for (no key, --allow-unsigned) records any size:
// copied as it came, a claimed terabyte filled the disk. A file system whose free space cannot
// be told is not checked.
func roomFor(dir string, need int64) error {
	for {
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) || filepath.Dir(dir) == dir {
			break
		}
		dir = filepath.Dir(dir)
	}
	free, ok := freeBytes(dir)
	if !ok || need <= free-max(free/10, minKeepFree) {
		return nil
	}
	return fmt.Errorf("%w: %d bytes by the manifest, and the file system of %s has %d free (a copy leaves a tenth of that and %d MiB free)", errNoRoom, need, dir, free, minKeepFree>>20)
}

// totalSize is the bytes of subjects together, math.MaxInt64 when they are more.
func totalSize(subjects []provenance.Subject) int64 {
	var total int64
	for _, s := range subjects {
		if s.Size > math.MaxInt64-total {
			return math.MaxInt64
		}
		total += s.Size
	}
	return total
}
