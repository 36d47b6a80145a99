package provenance

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
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

// KeyID names a public key in envelopes: the lowercase hex SHA-256 of its PKIX DER encoding.
func KeyID(pub ed25519.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		// Only a key of the wrong length fails here; give it an id that matches nothing real.
		der = pub
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// Sign wraps a statement in a DSSE envelope signed with key and returns the envelope's JSON.
func Sign(ctx context.Context, statement []byte, key ed25519.PrivateKey) ([]byte, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("provenance: sign: %w: not an ed25519 private key", ErrInvalid)
	}
	signer, err := dsse.NewEnvelopeSigner(newEd25519(key.Public().(ed25519.PublicKey), key))
	if err != nil {
		return nil, fmt.Errorf("provenance: sign: %w", err)
	}
	env, err := signer.SignPayload(ctx, PayloadType, statement)
	if err != nil {
		return nil, fmt.Errorf("provenance: sign: %w", err)
	}
	data, err := json.Marshal(env)
	if err != nil {
		return nil, fmt.Errorf("provenance: sign: %w", err)
	}
	return data, nil
}

// VerifyEnvelope checks a DSSE envelope's payload type and its signature by pub, and returns
// the signed statement. A bad envelope wraps ErrInvalid; a signature that does not verify, or
// none by pub, wraps ErrBadSignature.
func VerifyEnvelope(ctx context.Context, envelope []byte, pub ed25519.PublicKey) ([]byte, error) {
	if len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("provenance: verify envelope: %w: not an ed25519 public key", ErrInvalid)
	}
	var env dsse.Envelope
	if err := json.Unmarshal(envelope, &env); err != nil {
		return nil, fmt.Errorf("provenance: verify envelope: %w: %v", ErrInvalid, err)
	}
	if env.PayloadType != PayloadType {
		return nil, fmt.Errorf("provenance: verify envelope: %w: payload type %q, want %s", ErrInvalid, env.PayloadType, PayloadType)
	}
	verifier, err := dsse.NewEnvelopeVerifier(newEd25519(pub, nil))
	if err != nil {
		return nil, fmt.Errorf("provenance: verify envelope: %w", err)
	}
	_, statement, err := verifier.VerifyAndDecode(ctx, &env)
	if err != nil {
		if errors.Is(err, dsse.ErrNoSignature) {
			return nil, fmt.Errorf("provenance: verify envelope: %w: the envelope has no signature", ErrBadSignature)
		}
		return nil, fmt.Errorf("provenance: verify envelope: %w: no valid signature by key %s: %v", ErrBadSignature, KeyID(pub), err)
	}
	return statement, nil
}

// ed25519SV is a dsse.SignerVerifier over one ed25519 key; priv is nil when it only verifies.
type ed25519SV struct {
	pub   ed25519.PublicKey
	priv  ed25519.PrivateKey
	keyID string
}

var _ dsse.SignerVerifier = (*ed25519SV)(nil)

func newEd25519(pub ed25519.PublicKey, priv ed25519.PrivateKey) *ed25519SV {
	return &ed25519SV{pub: pub, priv: priv, keyID: KeyID(pub)}
}

// Sign signs the DSSE pre-authentication encoding of the payload.
func (k *ed25519SV) Sign(_ context.Context, data []byte) ([]byte, error) {
	if k.priv == nil {
		return nil, errors.New("no private key")
	}
	return ed25519.Sign(k.priv, data), nil
}

// Verify checks a signature over the DSSE pre-authentication encoding.
func (k *ed25519SV) Verify(_ context.Context, data, sig []byte) error {
	if !ed25519.Verify(k.pub, data, sig) {
		return ErrBadSignature
	}
	return nil
}

// KeyID returns the key's id; see KeyID.
func (k *ed25519SV) KeyID() (string, error) { return k.keyID, nil }

// Public returns the public key.
func (k *ed25519SV) Public() crypto.PublicKey { return k.pub }
