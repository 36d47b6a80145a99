// Package interop verifies Boxcar's signed manifests with other projects' verifiers, as their
// users would call them: go-securesystemslib's DSSE verifier, in-toto-golang's keys and
// sigstore-go's bundle verifier (the library under `cosign verify-blob-attestation --bundle`).
// Only tests import it, so none of those libraries ends up in a Boxcar binary.
package interop

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	intoto "github.com/in-toto/in-toto-golang/in_toto"
	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	"github.com/secure-systems-lab/go-securesystemslib/signerverifier"
	"github.com/sigstore/sigstore-go/pkg/bundle"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/verify"
	"github.com/sigstore/sigstore/pkg/signature"
)

// SSLib verifies envelope with go-securesystemslib's DSSE verifier for the PEM public key,
// with the keyid that library derives from it, and returns the payload.
func SSLib(ctx context.Context, envelope, pubPEM []byte) ([]byte, error) {
	key, err := signerverifier.LoadKey(pubPEM)
	if err != nil {
		return nil, fmt.Errorf("go-securesystemslib: load key: %w", err)
	}
	sv, err := signerverifier.NewED25519SignerVerifierFromSSLibKey(key)
	if err != nil {
		return nil, fmt.Errorf("go-securesystemslib: %w", err)
	}
	return verifyDSSE(ctx, envelope, sv)
}

// InToto verifies envelope as in-toto-golang's Envelope.VerifySignature does: the key loaded
// with in_toto.Key's defaults (its keyid included) and go-securesystemslib's verifier made
// from it. (in-toto-golang's own LoadMetadata reads only link and layout payloads, not
// Statements, so its verifier is driven here with the key it loads.)
func InToto(ctx context.Context, envelope, pubPEM []byte) ([]byte, error) {
	var k intoto.Key
	if err := k.LoadKeyReaderDefaults(bytes.NewReader(pubPEM)); err != nil {
		return nil, fmt.Errorf("in-toto-golang: load key: %w", err)
	}
	sv, err := signerverifier.NewED25519SignerVerifierFromSSLibKey(&signerverifier.SSLibKey{
		KeyType: k.KeyType, Scheme: k.Scheme, KeyIDHashAlgorithms: k.KeyIDHashAlgorithms, KeyID: k.KeyID,
		KeyVal: signerverifier.KeyVal{Public: k.KeyVal.Public},
	})
	if err != nil {
		return nil, fmt.Errorf("in-toto-golang: %w", err)
	}
	return verifyDSSE(ctx, envelope, sv)
}

func verifyDSSE(ctx context.Context, envelope []byte, v dsse.Verifier) ([]byte, error) {
	var e dsse.Envelope
	if err := json.Unmarshal(envelope, &e); err != nil {
		return nil, err
	}
	ev, err := dsse.NewEnvelopeVerifier(v)
	if err != nil {
		return nil, err
	}
	accepted, err := ev.Verify(ctx, &e)
	if err != nil {
		return nil, err
	}
	if len(accepted) != 1 {
		return nil, fmt.Errorf("accepted %d signatures, want 1", len(accepted))
	}
	return e.DecodeB64Payload()
}

// Sigstore verifies a Sigstore bundle with sigstore-go the way cosign does for a public key
// and no transparency log: the key as trusted material, the current time, the artifact given
// by its SHA-256 (hex), which must be a subject of the statement.
func Sigstore(bundleJSON []byte, pub ed25519.PublicKey, artifactSHA256 string) (*verify.VerificationResult, error) {
	var b bundle.Bundle
	if err := b.UnmarshalJSON(bundleJSON); err != nil {
		return nil, fmt.Errorf("sigstore-go: load bundle: %w", err)
	}
	sv, err := signature.LoadED25519Verifier(pub)
	if err != nil {
		return nil, err
	}
	trusted := root.NewTrustedPublicKeyMaterial(func(string) (root.TimeConstrainedVerifier, error) {
		return root.NewExpiringKey(sv, time.Time{}, time.Time{}), nil
	})
	v, err := verify.NewVerifier(trusted, verify.WithCurrentTime())
	if err != nil {
		return nil, err
	}
	digest, err := hex.DecodeString(artifactSHA256)
	if err != nil {
		return nil, errors.New("the artifact's sha256 is not hex")
	}
	return v.Verify(&b, verify.NewPolicy(verify.WithArtifactDigest("sha256", digest), verify.WithKey()))
}
