package provenance_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	"github.com/secure-systems-lab/go-securesystemslib/signerverifier"

	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/provenance/interop"
)

// TestOtherVerifiersAcceptEnvelope verifies Boxcar's envelope as users of go-securesystemslib
// and in-toto-golang would, with the PEM public key and the keyid each library derives from
// it. Those verifiers skip a signature whose keyid names another key, so envelopes carrying
// Boxcar's own keyid scheme were rejected ("accepted signatures do not match threshold").
func TestOtherVerifiersAcceptEnvelope(t *testing.T) {
	privPEM, pubPEM := provenance.GenerateKey()
	priv, err := provenance.LoadPrivateKey(privPEM)
	if err != nil {
		t.Fatal(err)
	}
	_, otherPEM := provenance.GenerateKey()
	statement := build(t, sampleManifest(t), sampleSubjects())
	env := sign(t, statement, priv)
	for name, verify := range map[string]func(t *testing.T, env, pubPEM []byte) ([]byte, error){
		"go-securesystemslib": func(t *testing.T, env, pubPEM []byte) ([]byte, error) { return interop.SSLib(t.Context(), env, pubPEM) },
		"in-toto-golang": func(t *testing.T, env, pubPEM []byte) ([]byte, error) {
			return interop.InToto(t.Context(), env, pubPEM)
		},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := verify(t, env, pubPEM)
			if err != nil {
				t.Fatalf("%s rejects the envelope: %v\n%.300s…", name, err, env)
			}
			if !bytes.Equal(got, statement) {
				t.Errorf("%s returned a payload other than the statement", name)
			}
			if _, err := verify(t, env, otherPEM); err == nil {
				t.Errorf("%s accepts the envelope with another key: the check proves nothing", name)
			}
		})
	}
}

// TestBundle wraps envelopes in Sigstore bundles and verifies them with sigstore-go, the
// library under `cosign verify-blob-attestation --bundle`: a new envelope and one of a run
// signed before envelopes dropped their keyid.
func TestBundle(t *testing.T) {
	priv, pub := keys(t)
	_, otherPub := keys(t)
	statement := build(t, sampleManifest(t), sampleSubjects())
	oldPub, err := provenance.ReadPublicKeyFile(filepath.Join("testdata", "v1-keyid", "signing.pub"))
	if err != nil {
		t.Fatal(err)
	}
	oldEnv, err := os.ReadFile(filepath.Join("testdata", "v1-keyid", "manifest.dsse.json"))
	if err != nil {
		t.Fatal(err)
	}
	report := sampleSubjects()[1]
	if report.Name != "report.md" {
		t.Fatalf("sampleSubjects()[1] is %s, want report.md", report.Name)
	}
	for name, tt := range map[string]struct {
		env []byte
		pub ed25519.PublicKey
	}{
		"new envelope": {sign(t, statement, priv), pub},
		"old envelope": {oldEnv, oldPub},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := provenance.Bundle(t.Context(), tt.env, tt.pub)
			if err != nil {
				t.Fatal(err)
			}
			var doc struct {
				MediaType string `json:"mediaType"`
			}
			if err := json.Unmarshal(b, &doc); err != nil || doc.MediaType != provenance.BundleMediaType {
				t.Errorf("bundle media type = %q, %v", doc.MediaType, err)
			}
			res, err := interop.Sigstore(b, tt.pub, report.SHA256)
			if err != nil {
				t.Fatalf("sigstore-go rejects the bundle: %v\n%.300s…", err, b)
			}
			if res.Statement == nil || res.Statement.GetPredicateType() != provenance.PredicateType {
				t.Errorf("sigstore-go's result has statement %v, want predicate type %s", res.Statement, provenance.PredicateType)
			}
			if _, err := interop.Sigstore(b, otherPub, report.SHA256); err == nil {
				t.Error("sigstore-go accepts the bundle with another key")
			}
			if _, err := interop.Sigstore(b, tt.pub, sha("not a subject")); err == nil {
				t.Error("sigstore-go accepts the bundle for an artifact that is not a subject")
			}
		})
	}
	t.Run("refused", func(t *testing.T) {
		env := sign(t, statement, priv)
		if _, err := provenance.Bundle(t.Context(), env, otherPub); !errors.Is(err, provenance.ErrBadSignature) {
			t.Errorf("Bundle with another key: %v, want ErrBadSignature", err)
		}
		var e envelope
		if err := json.Unmarshal(env, &e); err != nil {
			t.Fatal(err)
		}
		e.Signatures = append(e.Signatures, e.Signatures[0])
		two, _ := json.Marshal(e)
		if _, err := provenance.Bundle(t.Context(), two, pub); !errors.Is(err, provenance.ErrInvalid) {
			t.Errorf("Bundle of two signatures: %v, want ErrInvalid", err)
		}
	})
}

// sslibKeyID is the keyid go-securesystemslib (and in-toto-golang) derive from pub.
func sslibKeyID(t *testing.T, pub ed25519.PublicKey) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	key, err := signerverifier.LoadKey(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	if err != nil {
		t.Fatal(err)
	}
	return key.KeyID
}

// sshKeyID is the keyid go-securesystemslib gives a verifier without one, as sigstore-go's.
func sshKeyID(t *testing.T, pub ed25519.PublicKey) string {
	t.Helper()
	id, err := dsse.SHA256KeyID(pub)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
