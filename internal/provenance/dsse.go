package provenance

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"
)

// PayloadType is the DSSE payload type of an in-toto statement.
const PayloadType = "application/vnd.in-toto+json"

// GenerateKey returns a new ed25519 key pair as PEM: the private key in PKCS#8 ("PRIVATE
// KEY"), the public key in PKIX ("PUBLIC KEY").
func GenerateKey() (privPEM, pubPEM []byte) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	privDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		panic(err) // an ed25519 key always marshals
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		panic(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER}),
		pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
}

// LoadPrivateKey reads an ed25519 private key from a PKCS#8 PEM block.
func LoadPrivateKey(pemBytes []byte) (ed25519.PrivateKey, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("provenance: private key: %w: want a PEM block \"PRIVATE KEY\" (PKCS#8)", ErrInvalid)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("provenance: private key: %w: %v", ErrInvalid, err)
	}
	priv, ok := key.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("provenance: private key: %w: a %T, not ed25519", ErrInvalid, key)
	}
	return priv, nil
}

// LoadPublicKey reads an ed25519 public key from a PKIX PEM block.
func LoadPublicKey(pemBytes []byte) (ed25519.PublicKey, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil || block.Type != "PUBLIC KEY" {
		return nil, fmt.Errorf("provenance: public key: %w: want a PEM block \"PUBLIC KEY\" (PKIX)", ErrInvalid)
	}
	key, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("provenance: public key: %w: %v", ErrInvalid, err)
	}
	pub, ok := key.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("provenance: public key: %w: a %T, not ed25519", ErrInvalid, key)
	}
	return pub, nil
}

// KeyID names a public key for people: the lowercase hex SHA-256 of its PKIX DER encoding,
// the same as `openssl pkey -pubin -outform DER < signing.pub | sha256sum`. Envelopes written
// before 2026-12 carry it as their signature's keyid; newer ones carry no keyid (see Sign).
func KeyID(pub ed25519.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		// Only a key of the wrong length fails here; give it an id that matches nothing real.
		der = pub
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// envelope is a DSSE envelope as Boxcar writes it. The keyid is left out: DSSE makes it an
// optional, unauthenticated hint, and the verifiers people use each derive their own from the
// key (go-securesystemslib and in-toto-golang a hash of the key's securesystemslib form,
// sigstore-go and cosign an SSH fingerprint) and skip a signature whose keyid differs, so no
// single id is accepted by all of them, but a missing one is.
type envelope struct {
	PayloadType string      `json:"payloadType"`
	Payload     string      `json:"payload"`
	Signatures  []signature `json:"signatures"`
}

type signature struct {
	KeyID string `json:"keyid,omitempty"`
	Sig   string `json:"sig"`
}

// Sign wraps a statement in a DSSE envelope signed with key and returns the envelope's JSON.
func Sign(ctx context.Context, statement []byte, key ed25519.PrivateKey) ([]byte, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("provenance: sign: %w: not an ed25519 private key", ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("provenance: sign: %w", err)
	}
	sig := ed25519.Sign(key, dsse.PAE(PayloadType, statement))
	data, err := json.Marshal(envelope{
		PayloadType: PayloadType,
		Payload:     base64.StdEncoding.EncodeToString(statement),
		Signatures:  []signature{{Sig: base64.StdEncoding.EncodeToString(sig)}},
	})
	if err != nil {
		return nil, fmt.Errorf("provenance: sign: %w", err)
	}
	return data, nil
}

// VerifyEnvelope checks a DSSE envelope's payload type and its signature by pub, and returns
// the signed statement. A signature's keyid is not consulted: it is an unauthenticated hint,
// and envelopes carry Boxcar's KeyID (older runs), none (newer runs) or another tool's id.
// A bad envelope wraps ErrInvalid; a signature that does not verify, or none by pub, wraps
// ErrBadSignature.
func VerifyEnvelope(ctx context.Context, envelope []byte, pub ed25519.PublicKey) ([]byte, error) {
	if len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("provenance: verify envelope: %w: not an ed25519 public key", ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("provenance: verify envelope: %w", err)
	}
	if err := checkShape(envelope, envelopeShape); err != nil {
		return nil, fmt.Errorf("provenance: verify envelope: %w", err)
	}
	var env dsse.Envelope
	if err := json.Unmarshal(envelope, &env); err != nil {
		return nil, fmt.Errorf("provenance: verify envelope: %w: %v", ErrInvalid, err)
	}
	if env.PayloadType != PayloadType {
		return nil, fmt.Errorf("provenance: verify envelope: %w: payload type %q, want %s", ErrInvalid, env.PayloadType, PayloadType)
	}
	statement, err := env.DecodeB64Payload()
	if err != nil {
		return nil, fmt.Errorf("provenance: verify envelope: %w: payload: %v", ErrInvalid, err)
	}
	if len(env.Signatures) == 0 {
		return nil, fmt.Errorf("provenance: verify envelope: %w: the envelope has no signature", ErrBadSignature)
	}
	pae := dsse.PAE(env.PayloadType, statement)
	for _, s := range env.Signatures {
		if sig, ok := decodeBase64(s.Sig); ok && ed25519.Verify(pub, pae, sig) {
			return statement, nil
		}
	}
	return nil, fmt.Errorf("provenance: verify envelope: %w: none of its %d signatures is by key %s", ErrBadSignature, len(env.Signatures), KeyID(pub))
}

// decodeBase64 reads standard or URL-safe base64, padded or not, as DSSE allows.
func decodeBase64(s string) ([]byte, bool) {
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			return b, true
		}
	}
	return nil, false
}
