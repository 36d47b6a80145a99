package provenance_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/boxcar-run/boxcar/internal/provenance"
)

type envelope struct {
	PayloadType string `json:"payloadType"`
	Payload     string `json:"payload"`
	Signatures  []struct {
		KeyID string `json:"keyid"`
		Sig   string `json:"sig"`
	} `json:"signatures"`
}

func keys(t *testing.T) (ed25519.PrivateKey, ed25519.PublicKey) {
	t.Helper()
	privPEM, pubPEM := provenance.GenerateKey()
	priv, err := provenance.LoadPrivateKey(privPEM)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := provenance.LoadPublicKey(pubPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !pub.Equal(priv.Public()) {
		t.Fatal("the PEM public key is not the private key's")
	}
	return priv, pub
}

func sign(t *testing.T, statement []byte, priv ed25519.PrivateKey) []byte {
	t.Helper()
	env, err := provenance.Sign(t.Context(), statement, priv)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func TestSignVerify(t *testing.T) {
	priv, pub := keys(t)
	statement := build(t, sampleManifest(t), sampleSubjects())
	env := sign(t, statement, priv)

	var e envelope
	if err := json.Unmarshal(env, &e); err != nil {
		t.Fatal(err)
	}
	// No keyid: each verifier derives its own, and skips a signature that names another.
	if e.PayloadType != provenance.PayloadType || len(e.Signatures) != 1 || e.Signatures[0].KeyID != "" || bytes.Contains(env, []byte(`"keyid"`)) {
		t.Errorf("envelope = %.200s…, want payload type %s and one signature without a keyid", env, provenance.PayloadType)
	}
	got, err := provenance.VerifyEnvelope(t.Context(), env, pub)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, statement) {
		t.Errorf("VerifyEnvelope returned another statement")
	}
}

func TestVerifyEnvelopeRejects(t *testing.T) {
	priv, pub := keys(t)
	_, otherPub := keys(t)
	statement := build(t, sampleManifest(t), sampleSubjects())
	good := sign(t, statement, priv)

	edit := func(f func(e *envelope)) []byte {
		var e envelope
		if err := json.Unmarshal(good, &e); err != nil {
			t.Fatal(err)
		}
		f(&e)
		data, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	tampered := bytes.Replace(statement, []byte(sha("report")), []byte(sha("forged report")), 1)
	tests := []struct {
		name     string
		envelope []byte
		pub      ed25519.PublicKey
		want     error
	}{
		{"tampered payload", edit(func(e *envelope) { e.Payload = base64.StdEncoding.EncodeToString(tampered) }), pub, provenance.ErrBadSignature},
		{"tampered signature", edit(func(e *envelope) {
			sig, _ := base64.StdEncoding.DecodeString(e.Signatures[0].Sig)
			sig[0] ^= 1
			e.Signatures[0].Sig = base64.StdEncoding.EncodeToString(sig)
		}), pub, provenance.ErrBadSignature},
		{"signature of another payload", edit(func(e *envelope) {
			var other envelope
			if err := json.Unmarshal(sign(t, tampered, priv), &other); err != nil {
				t.Fatal(err)
			}
			e.Signatures[0].Sig = other.Signatures[0].Sig
		}), pub, provenance.ErrBadSignature},
		{"no signature", edit(func(e *envelope) { e.Signatures = e.Signatures[:0] }), pub, provenance.ErrBadSignature},
		{"other key", good, otherPub, provenance.ErrBadSignature},
		{"signature in URL-safe base64 by another key", edit(func(e *envelope) {
			sig, _ := base64.StdEncoding.DecodeString(e.Signatures[0].Sig)
			sig[len(sig)-1] ^= 1
			e.Signatures[0].Sig = base64.RawURLEncoding.EncodeToString(sig)
		}), pub, provenance.ErrBadSignature},
		{"other payload type", edit(func(e *envelope) { e.PayloadType = "application/json" }), pub, provenance.ErrInvalid},
		{"not JSON", []byte("not json"), pub, provenance.ErrInvalid},
		{"no key", good, nil, provenance.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := provenance.VerifyEnvelope(t.Context(), tt.envelope, tt.pub)
			if !errors.Is(err, tt.want) {
				t.Errorf("VerifyEnvelope error = %v, want %v", err, tt.want)
			}
			if got != nil {
				t.Errorf("VerifyEnvelope returned a statement with an error")
			}
		})
	}
}

// TestVerifyEnvelopeKeyIDIsAHint: whatever keyid a signature carries (Boxcar's own, as runs
// before 2026-12 have it, another tool's, another key's or none), the signature decides.
func TestVerifyEnvelopeKeyIDIsAHint(t *testing.T) {
	priv, pub := keys(t)
	_, otherPub := keys(t)
	statement := build(t, sampleManifest(t), sampleSubjects())
	good := sign(t, statement, priv)
	for name, keyID := range map[string]string{
		"boxcar":    provenance.KeyID(pub),
		"sslib":     sslibKeyID(t, pub),
		"ssh":       sshKeyID(t, pub),
		"other key": provenance.KeyID(otherPub),
	} {
		t.Run(name, func(t *testing.T) {
			var e envelope
			if err := json.Unmarshal(good, &e); err != nil {
				t.Fatal(err)
			}
			e.Signatures[0].KeyID = keyID
			// A second, bad signature first: the good one still counts.
			e.Signatures = append([]struct {
				KeyID string `json:"keyid"`
				Sig   string `json:"sig"`
			}{{KeyID: keyID, Sig: base64.StdEncoding.EncodeToString(make([]byte, ed25519.SignatureSize))}}, e.Signatures...)
			env, err := json.Marshal(e)
			if err != nil {
				t.Fatal(err)
			}
			got, err := provenance.VerifyEnvelope(t.Context(), env, pub)
			if err != nil || !bytes.Equal(got, statement) {
				t.Errorf("VerifyEnvelope = %.40q…, %v; want the statement", got, err)
			}
		})
	}
}

// TestVerifyOldEnvelope: a run signed before envelopes dropped the keyid (testdata/v1-keyid,
// written by that version) still verifies.
func TestVerifyOldEnvelope(t *testing.T) {
	read := func(name string) []byte {
		data, err := os.ReadFile(filepath.Join("testdata", "v1-keyid", name))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	pub, err := provenance.LoadPublicKey(read("signing.pub"))
	if err != nil {
		t.Fatal(err)
	}
	env := read("manifest.dsse.json")
	if !bytes.Contains(env, []byte(`"keyid":"`+provenance.KeyID(pub)+`"`)) {
		t.Fatalf("the fixture does not carry the old keyid scheme:\n%.300s", env)
	}
	got, err := provenance.VerifyEnvelope(t.Context(), env, pub)
	if err != nil || !bytes.Equal(got, read("manifest.json")) {
		t.Errorf("VerifyEnvelope of an old envelope = %.40q…, %v; want its manifest", got, err)
	}
	if _, err := provenance.Parse(got); err != nil {
		t.Errorf("Parse of an old manifest: %v", err)
	}
}

func TestLoadKeysRejects(t *testing.T) {
	privPEM, pubPEM := provenance.GenerateKey()
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ecPrivDER, _ := x509.MarshalPKCS8PrivateKey(ec)
	ecPubDER, _ := x509.MarshalPKIXPublicKey(&ec.PublicKey)
	ecPriv := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: ecPrivDER})
	ecPub := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: ecPubDER})
	tests := []struct {
		name string
		load func([]byte) error
		pem  []byte
	}{
		{"private: garbage", loadPriv, []byte("garbage")},
		{"private: a public key", loadPriv, pubPEM},
		{"private: ecdsa", loadPriv, ecPriv},
		{"private: bad DER", loadPriv, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2, 3}})},
		{"public: garbage", loadPub, []byte("garbage")},
		{"public: a private key", loadPub, privPEM},
		{"public: ecdsa", loadPub, ecPub},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.load(tt.pem); !errors.Is(err, provenance.ErrInvalid) {
				t.Errorf("error = %v, want ErrInvalid", err)
			}
		})
	}
}

func loadPriv(b []byte) error { _, err := provenance.LoadPrivateKey(b); return err }
func loadPub(b []byte) error  { _, err := provenance.LoadPublicKey(b); return err }
