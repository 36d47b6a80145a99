package workercmd

import (
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/provenance"
)

// keysDir is where the embedded worker keeps its signing key pair, under the data dir.
const keysDir = "keys"

// signingKey returns the key that signs every manifest: the file --signing-key names, else the
// config's signing_key, else, in embedded mode, the pair kept in <data dir>/keys, created on the
// first start. Without any of these (a worker with --config and no key) manifests go unsigned,
// and the worker says so once.
func signingKey(o Options, cfg config.Config, log *slog.Logger) (ed25519.PrivateKey, error) {
	path, source := o.SigningKey, "--signing-key"
	if path == "" {
		path, source = cfg.SigningKey, "signing_key"
	}
	if path != "" {
		key, err := provenance.ReadPrivateKeyFile(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w (make a key pair with `worker keygen --out DIR`)", source, err)
		}
		// Group bits are allowed: a Kubernetes Secret volume reaches a non-root worker through
		// its fsGroup (defaultMode 0440).
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o007 != 0 {
			log.Warn("every user of this machine can read the signing key file; make it mode 0600 (0440 with an fsGroup for a Secret volume)",
				"path", path, "mode", fmt.Sprintf("%04o", fi.Mode().Perm()))
		}
		log.Info("manifests are signed", "key_id", provenance.KeyID(key.Public().(ed25519.PublicKey)), "key_source", source, "path", path)
		return key, nil
	}
	if !o.Embedded {
		log.Warn("manifests are not signed: no --signing-key and no signing_key in the config; `submit verify` can check digests only")
		return nil, nil
	}
	dir := filepath.Join(o.DataDir, keysDir)
	key, kp, created, err := provenance.LoadOrCreateKeyPair(dir)
	if err != nil {
		return nil, fmt.Errorf("signing key in the data dir: %w", err)
	}
	if created {
		log.Info("created a signing key pair for manifests", "key_id", kp.KeyID, "private_key", kp.PrivatePath, "public_key", kp.PublicPath)
	}
	log.Info("manifests are signed", "key_id", kp.KeyID, "key_source", "data dir", "public_key", kp.PublicPath)
	return key, nil
}

// approverKeys are the keys whose signed answers to approval requests the worker trusts: the
// config's approver_keyring, else, in embedded mode, the key pair in <data dir>/keys/approver
// (created on first start, named "local"), which a local `submit approve` signs with.
func approverKeys(o Options, cfg config.Config, log *slog.Logger) (provenance.Keyring, error) {
	if cfg.ApproverKeyring != "" {
		ring, err := provenance.LoadKeyring(cfg.ApproverKeyring)
		if err != nil {
			return nil, fmt.Errorf("approver_keyring: %w", err)
		}
		names := make([]string, len(ring))
		for i, k := range ring {
			names[i] = k.Name
		}
		log.Info("approvals are trusted when signed by a key of the keyring", "path", cfg.ApproverKeyring, "approvers", names)
		return ring, nil
	}
	if !o.Embedded {
		log.Warn("no approver_keyring in the config: every answer to an \"ask\" command is refused")
		return nil, nil
	}
	key, kp, created, err := provenance.LoadOrCreateKeyPair(filepath.Join(o.DataDir, keysDir, "approver"))
	if err != nil {
		return nil, fmt.Errorf("approver key in the data dir: %w", err)
	}
	if created {
		log.Info("created an approver key pair; `submit approve` on this machine signs with it", "private_key", kp.PrivatePath)
	}
	return provenance.SingleKey("local", key.Public().(ed25519.PublicKey)), nil
}
