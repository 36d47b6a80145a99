package submitcmd

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/store"
)

// swappingStore is a store whose writer replaces the object at key after its first read, as
// whoever may write the store can between two reads of a reader.
type swappingStore struct {
	store.Store
	key   string
	swap  []byte
	reads atomic.Int32
}

func (s *swappingStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if key == s.key && s.reads.Add(1) > 1 {
		return io.NopCloser(bytes.NewReader(s.swap)), nil
	}
	return s.Store.Get(ctx, key)
}

// TestGetWritesTheEnvelopeItChecked: get writes the manifest and the envelope it checked, read
// once each, so a writer of the store who replaces either once get has read it changes
// nothing get writes. It read the envelope a second time to write it: the envelope written
// beside the manifest was the one the writer put there after the check, unchecked, with get
// saying the manifest was signed.
func TestGetWritesTheEnvelopeItChecked(t *testing.T) {
	te := newTestEnv(t)
	id := te.commitRun(t, true)
	for _, name := range []string{"manifest.json", "manifest.dsse.json"} {
		t.Run(name, func(t *testing.T) {
			key := provenance.ManifestKey(id)
			if name == "manifest.dsse.json" {
				key = provenance.SignatureKey(id)
			}
			checked, err := readObject(t.Context(), te.st, key, maxManifestBytes)
			if err != nil {
				t.Fatal(err)
			}
			swapping := &swappingStore{key: key, swap: []byte(`{"payloadType":"application/vnd.in-toto+json","payload":"e30=","signatures":[]}`)}
			out := filepath.Join(t.TempDir(), "run")
			var stdout, stderr bytes.Buffer
			e := &env{getenv: te.getenv, stdout: &stdout, stderr: &stderr, publish: defaultPublishPolicy,
				wrapStore: func(st store.Store) store.Store { swapping.Store = st; return swapping }}
			if err := run(t.Context(), e, []string{"get", id, "--out", out}); err != nil {
				t.Fatalf("get: %v\n%s", err, stderr.String())
			}
			written, err := os.ReadFile(filepath.Join(out, name))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(written, checked) {
				t.Errorf("get wrote %s as %q, the object put after its check (read %d times); want the bytes it checked", name, written, swapping.reads.Load())
			}
		})
	}
}
