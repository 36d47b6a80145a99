package runner

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/job"
)

// TestCheckedReader: an input streamed into the sandbox passes only as exactly the bytes its
// size and digest name; anything else fails the stream with errInputMismatch, so the sandbox
// does not put the file in place.
func TestCheckedReader(t *testing.T) {
	t.Parallel()
	sum := func(s string) string {
		h := sha256.Sum256([]byte(s))
		return hex.EncodeToString(h[:])
	}
	in := job.Input{Name: "in.csv", SHA256: sum("a,b\n1,2\n"), Size: 8}
	tests := []struct {
		name   string
		stored string
		err    error
	}{
		{name: "the bytes it names", stored: "a,b\n1,2\n"},
		{name: "changed, same size", stored: "a,b\n1,3\n", err: errInputMismatch},
		{name: "shorter", stored: "a,b\n", err: errInputMismatch},
		{name: "longer", stored: "a,b\n1,2\n3,4\n", err: errInputMismatch},
		{name: "empty", stored: "", err: errInputMismatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCheckedReader(strings.NewReader(tt.stored), in)
			_, err := io.Copy(io.Discard, c)
			if !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
				t.Errorf("copy = %v, want %v", err, tt.err)
			}
			// finish after a full read adds nothing; after a read cut at the size it reads
			// the rest.
			c = newCheckedReader(strings.NewReader(tt.stored), in)
			_, err = io.Copy(io.Discard, io.LimitReader(c, in.Size))
			if err == nil {
				err = c.finish()
			}
			if !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
				t.Errorf("copy of the declared size, then finish = %v, want %v", err, tt.err)
			}
		})
	}
}
