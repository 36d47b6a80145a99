package provenance_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/boxcar-run/boxcar/internal/provenance"
)

func TestWriteKeyPair(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	kp, err := provenance.WriteKeyPair(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		path string
		mode fs.FileMode
	}{{kp.PrivatePath, 0o600}, {kp.PublicPath, 0o644}, {dir, fs.ModeDir | 0o700}} {
		fi, err := os.Stat(f.path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != f.mode {
			t.Errorf("%s: mode %v, want %v", f.path, fi.Mode(), f.mode)
		}
	}
	priv, err := provenance.ReadPrivateKeyFile(kp.PrivatePath)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := provenance.ReadPublicKeyFile(kp.PublicPath)
	if err != nil {
		t.Fatal(err)
	}
	if !pub.Equal(priv.Public()) {
		t.Error("the public key file does not hold the private key's public half")
	}
	if kp.KeyID != provenance.KeyID(pub) {
		t.Errorf("KeyID = %s, want %s", kp.KeyID, provenance.KeyID(pub))
	}

	// A signature made with the written key verifies with the written public key.
	env, err := provenance.Sign(context.Background(), []byte(`{"a":1}`), priv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provenance.VerifyEnvelope(context.Background(), env, pub); err != nil {
		t.Errorf("VerifyEnvelope: %v", err)
	}

	before, _ := os.ReadFile(kp.PrivatePath)
	if _, err := provenance.WriteKeyPair(dir); !errors.Is(err, fs.ErrExist) {
		t.Errorf("second WriteKeyPair: %v, want fs.ErrExist", err)
	}
	if after, _ := os.ReadFile(kp.PrivatePath); !bytes.Equal(before, after) {
		t.Error("second WriteKeyPair replaced the private key")
	}
}

func TestLoadOrCreateKeyPair(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data", "keys")
	key, kp, created, err := provenance.LoadOrCreateKeyPair(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !created {
		t.Error("created = false on an empty folder")
	}
	if fi, err := os.Stat(kp.PrivatePath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("private key file: %v, %v; want mode 0600", fi, err)
	}

	again, kp2, created, err := provenance.LoadOrCreateKeyPair(dir)
	if err != nil {
		t.Fatal(err)
	}
	if created || !again.Equal(key) || kp2.KeyID != kp.KeyID {
		t.Errorf("second call: created %v, same key %v; want the existing key", created, again.Equal(key))
	}

	// A missing or stale public key file is rewritten from the private key.
	otherKP, err := provenance.WriteKeyPair(filepath.Join(t.TempDir(), "other"))
	if err != nil {
		t.Fatal(err)
	}
	stale, _ := os.ReadFile(otherKP.PublicPath)
	tests := []struct {
		name    string
		prepare func() error
	}{
		{"missing", func() error { return os.Remove(kp.PublicPath) }},
		{"stale", func() error { return os.WriteFile(kp.PublicPath, stale, 0o644) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.prepare(); err != nil {
				t.Fatal(err)
			}
			if _, _, _, err := provenance.LoadOrCreateKeyPair(dir); err != nil {
				t.Fatal(err)
			}
			pub, err := provenance.ReadPublicKeyFile(kp.PublicPath)
			if err != nil {
				t.Fatal(err)
			}
			if !pub.Equal(key.Public()) {
				t.Error("public key file does not match the private key")
			}
		})
	}
}

func TestLoadOrCreateKeyPairConcurrent(t *testing.T) {
	dir := t.TempDir()
	const n = 8
	keys := make([]ed25519.PrivateKey, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { keys[i], _, _, errs[i] = provenance.LoadOrCreateKeyPair(dir) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if !keys[i].Equal(keys[0]) {
			t.Fatalf("caller %d got another key than caller 0", i)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("folder holds %d entries, want signing.key and signing.pub only", len(entries))
	}
}

func TestReadKeyFileErrors(t *testing.T) {
	dir := t.TempDir()
	kp, err := provenance.WriteKeyPair(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provenance.ReadPrivateKeyFile(kp.PublicPath); !errors.Is(err, provenance.ErrInvalid) {
		t.Errorf("a public key read as private: %v, want ErrInvalid", err)
	}
	if _, err := provenance.ReadPublicKeyFile(kp.PrivatePath); !errors.Is(err, provenance.ErrInvalid) {
		t.Errorf("a private key read as public: %v, want ErrInvalid", err)
	}
	if _, err := provenance.ReadPublicKeyFile(filepath.Join(dir, "none.pub")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file: %v, want fs.ErrNotExist", err)
	}
}
