package provenance

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Names of the two files of a key folder: what `worker keygen` and `submit keygen` write, and
// what the embedded worker keeps in <data dir>/keys.
const (
	PrivateKeyFile = "signing.key" // PKCS#8 PEM, mode 0600
	PublicKeyFile  = "signing.pub" // PKIX PEM, mode 0644
)

// maxKeyFileBytes bounds what a key file may hold; a PEM ed25519 key is about 120 bytes.
const maxKeyFileBytes = 64 << 10

// KeyPair names a key pair on disk.
type KeyPair struct {
	PrivatePath string
	PublicPath  string
	// KeyID is the id envelopes carry for the public key; see KeyID.
	KeyID string
}

// ReadPrivateKeyFile reads an ed25519 private key from a PKCS#8 PEM file.
func ReadPrivateKeyFile(path string) (ed25519.PrivateKey, error) {
	data, err := readKeyFile(path)
	if err != nil {
		return nil, err
	}
	key, err := LoadPrivateKey(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return key, nil
}

// ReadPublicKeyFile reads an ed25519 public key from a PKIX PEM file.
func ReadPublicKeyFile(path string) (ed25519.PublicKey, error) {
	data, err := readKeyFile(path)
	if err != nil {
		return nil, err
	}
	key, err := LoadPublicKey(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return key, nil
}

func readKeyFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("provenance: key file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("provenance: key file %s: %w", path, err)
	}
	if len(data) > maxKeyFileBytes {
		return nil, fmt.Errorf("provenance: key file %s: %w: larger than %d bytes", path, ErrInvalid, maxKeyFileBytes)
	}
	return data, nil
}

// WriteKeyPair generates a new ed25519 key pair into dir (created 0700 if missing): the private
// key in PrivateKeyFile with mode 0600 and the public key in PublicKeyFile with mode 0644. It
// never replaces a key: when either file exists it fails with an error wrapping fs.ErrExist and
// leaves the folder as it was.
func WriteKeyPair(dir string) (KeyPair, error) {
	kp := keyPaths(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return kp, fmt.Errorf("provenance: write key pair: %w", err)
	}
	for _, p := range []string{kp.PrivatePath, kp.PublicPath} {
		if _, err := os.Lstat(p); err == nil {
			return kp, fmt.Errorf("provenance: write key pair: %s: %w; remove it first to make a new key", p, fs.ErrExist)
		}
	}
	privPEM, pubPEM := GenerateKey()
	if err := createFile(kp.PrivatePath, privPEM, 0o600); err != nil {
		return kp, fmt.Errorf("provenance: write key pair: %w", err)
	}
	if err := createFile(kp.PublicPath, pubPEM, 0o644); err != nil {
		// Leave no private key without its public half, so that a retry starts clean.
		_ = os.Remove(kp.PrivatePath)
		return kp, fmt.Errorf("provenance: write key pair: %w", err)
	}
	pub, err := LoadPublicKey(pubPEM)
	if err != nil {
		return kp, err
	}
	kp.KeyID = KeyID(pub)
	return kp, nil
}

// LoadOrCreateKeyPair returns the private key kept in dir, creating a new pair there first when
// dir holds no PrivateKeyFile (created reports that). The public key file is rewritten from the
// private key when it is missing or holds another key, so verifiers that read it by default
// always find the key that signs. Of concurrent callers on one folder exactly one creates the
// key and all return it.
func LoadOrCreateKeyPair(dir string) (key ed25519.PrivateKey, kp KeyPair, created bool, err error) {
	kp = keyPaths(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, kp, false, fmt.Errorf("provenance: key pair: %w", err)
	}
	if _, err := os.Lstat(kp.PrivatePath); errors.Is(err, fs.ErrNotExist) {
		privPEM, _ := GenerateKey()
		err := createFile(kp.PrivatePath, privPEM, 0o600)
		switch {
		case err == nil:
			created = true
		case errors.Is(err, fs.ErrExist): // another process created it meanwhile: use theirs
		default:
			return nil, kp, false, fmt.Errorf("provenance: key pair: %w", err)
		}
	}
	key, err = ReadPrivateKeyFile(kp.PrivatePath)
	if err != nil {
		return nil, kp, created, err
	}
	pub := key.Public().(ed25519.PublicKey)
	kp.KeyID = KeyID(pub)
	want, err := publicPEM(pub)
	if err != nil {
		return nil, kp, created, err
	}
	if have, err := os.ReadFile(kp.PublicPath); err == nil && bytes.Equal(have, want) {
		return key, kp, created, nil
	}
	if err := replaceFile(kp.PublicPath, want, 0o644); err != nil {
		return nil, kp, created, fmt.Errorf("provenance: key pair: %w", err)
	}
	return key, kp, created, nil
}

func keyPaths(dir string) KeyPair {
	return KeyPair{PrivatePath: filepath.Join(dir, PrivateKeyFile), PublicPath: filepath.Join(dir, PublicKeyFile)}
}

// publicPEM is the PKIX PEM of pub, as GenerateKey writes it.
func publicPEM(pub ed25519.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("provenance: public key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// createFile writes data to path only if nothing is there: the data goes to a temporary file
// that is then hard-linked into place, so nobody ever reads a half-written key, and of two
// writers exactly one wins (the other gets fs.ErrExist).
func createFile(path string, data []byte, mode os.FileMode) error {
	tmp, err := writeTemp(path, data, mode)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); err != nil {
		var le *os.LinkError
		if errors.As(err, &le) && errors.Is(le.Err, fs.ErrExist) {
			return fmt.Errorf("%s: %w", path, fs.ErrExist)
		}
		return err
	}
	return nil
}

// replaceFile writes data to path atomically, replacing whatever was there.
func replaceFile(path string, data []byte, mode os.FileMode) error {
	tmp, err := writeTemp(path, data, mode)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

func writeTemp(path string, data []byte, mode os.FileMode) (string, error) {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return "", err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(tmp)
		return "", err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(tmp)
		return "", err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return "", err
	}
	// The umask may have taken bits away; set exactly what was asked.
	if err := os.Chmod(tmp, mode); err != nil {
		os.Remove(tmp)
		return "", err
	}
	return tmp, nil
}
