package provenance

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
)

// BundleMediaType is the media type of the Sigstore bundles Bundle writes (bundle format
// v0.3, github.com/sigstore/protobuf-specs).
const BundleMediaType = "application/vnd.dev.sigstore.bundle.v0.3+json"

// bundle is a Sigstore bundle for a key-signed DSSE envelope, in the bundle's JSON form. A
// bundle for a long-lived key carries no certificate, no transparency log entry and no
// timestamp; verifiers take the key from their own trusted material, found by the hint.
type bundle struct {
	MediaType            string               `json:"mediaType"`
	VerificationMaterial verificationMaterial `json:"verificationMaterial"`
	DSSEEnvelope         envelope             `json:"dsseEnvelope"`
}

type verificationMaterial struct {
	PublicKey struct {
		Hint string `json:"hint"`
	} `json:"publicKey"`
}

// Bundle wraps a DSSE envelope that pub signed in a Sigstore bundle, so that
// `cosign verify-blob-attestation --bundle` and sigstore-go verify it with the public key
// alone. The envelope's one signature is kept and its keyid dropped (an envelope of an older
// run names Boxcar's KeyID, which those verifiers would take for another key's); the hint is
// KeyID(pub). An envelope that pub did not sign is refused with ErrBadSignature, one that is
// not a Boxcar envelope with exactly one signature with ErrInvalid.
func Bundle(ctx context.Context, envelopeJSON []byte, pub ed25519.PublicKey) ([]byte, error) {
	if err := checkShape(envelopeJSON, envelopeShape); err != nil {
		return nil, fmt.Errorf("provenance: bundle: %w", err)
	}
	var env envelope
	if err := json.Unmarshal(envelopeJSON, &env); err != nil {
		return nil, fmt.Errorf("provenance: bundle: %w: %v", ErrInvalid, err)
	}
	if len(env.Signatures) != 1 {
		// A Sigstore bundle's envelope holds exactly one signature.
		return nil, fmt.Errorf("provenance: bundle: %w: the envelope has %d signatures, a Sigstore bundle takes one", ErrInvalid, len(env.Signatures))
	}
	if _, err := VerifyEnvelope(ctx, envelopeJSON, pub); err != nil {
		return nil, fmt.Errorf("provenance: bundle: %w", err)
	}
	env.Signatures[0].KeyID = ""
	b := bundle{MediaType: BundleMediaType, DSSEEnvelope: env}
	b.VerificationMaterial.PublicKey.Hint = KeyID(pub)
	data, err := json.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("provenance: bundle: %w", err)
	}
	return data, nil
}
