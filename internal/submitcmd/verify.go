package submitcmd

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/store"
)

// verifyOutput is what verify prints with --output json: provenance's verdict and what the
// command adds (where the key came from, objects nothing vouches for).
type verifyOutput struct {
	provenance.Verdict
	PublicKey string `json:"public_key,omitempty"` // the file the key came from
	// Unlisted are objects under the run's folder that the manifest does not name: nothing
	// vouches for them. They do not fail verification.
	Unlisted []string `json:"unlisted,omitempty"`
	// UnlistedMore says the folder holds more such objects than Unlisted names
	// (provenance.MaxUnlisted): verify lists no more of it.
	UnlistedMore bool `json:"unlisted_more,omitempty"`
}

func (e *env) verifyCmd() *cobra.Command {
	var (
		pubPath       string
		keyringPath   string
		require       bool
		allowUnsigned bool
	)
	c := &cobra.Command{
		Use:   "verify JOB_ID",
		Short: "check the run against its manifest and the manifest's signature",
		Long: `Checks that the manifest is Boxcar provenance for this job, that the envelope's signature covers
the stored manifest, and re-hashes every subject and input. Exit 0: verified; 8: a check failed;
1: the store could not be read, or the job has no committed run yet (queued, running), so
nothing was decided. It fails closed: a run with no
signature, or with no key to check it, fails unless --allow-unsigned. Keys: --keyring FILE
(names, public keys and the dates each was in use, so runs signed before a rotation verify),
else --public-key FILE, else $BOXCAR_HOME/keys/signing.pub, the embedded worker's.`,
		Args: jobIDArgs(1, 1, "verify: give one JOB_ID"),
		RunE: func(c *cobra.Command, a []string) error {
			if keyringPath == "" {
				keyringPath = e.getenv("BOXCAR_KEYRING")
			}
			return e.verify(c.Context(), a[0], verifyKeys{pubPath: pubPath, keyringPath: keyringPath}, allowUnsigned)
		},
	}
	signerKeyFlags(c, &pubPath, &keyringPath)
	c.Flags().BoolVar(&allowUnsigned, "allow-unsigned", false, "accept a run whose signature cannot be checked (none, or no key); its files are still checked")
	c.Flags().BoolVar(&require, "require-signature", false, "the default; kept for scripts")
	_ = c.Flags().MarkHidden("require-signature")
	e.common(c, true)
	return c
}

// signerKeyFlags adds --public-key and --keyring, the keys that check a run's signature
// (verify, get).
func signerKeyFlags(c *cobra.Command, pubPath, keyringPath *string) {
	c.Flags().StringVar(pubPath, "public-key", "", "ed25519 public key (PEM) of the worker that signs (default: $BOXCAR_HOME/keys/signing.pub, the embedded worker's, when it exists) (`FILE`)")
	c.Flags().StringVar(keyringPath, "keyring", "", "keyring (YAML) of the signers' public keys with their validity dates (default $BOXCAR_KEYRING; see docs/security.md) (`FILE`)")
	_ = c.MarkFlagFilename("public-key", "pub", "pem")
}

// verifyKeys are where verify's trusted keys come from.
type verifyKeys struct{ pubPath, keyringPath string }

// ring returns the trusted keys and the file they came from ("" for none).
func (e *env) ring(k verifyKeys) (provenance.Keyring, string, error) {
	if k.keyringPath != "" {
		if k.pubPath != "" {
			return nil, "", errors.New("give --keyring or --public-key, not both")
		}
		ring, err := provenance.LoadKeyring(k.keyringPath)
		if err != nil {
			return nil, "", fmt.Errorf("--keyring: %w", err)
		}
		return ring, k.keyringPath, nil
	}
	pub, file, err := e.publicKey(k.pubPath)
	return provenance.SingleKey(file, pub), file, err
}

func (e *env) verify(ctx context.Context, id string, keys verifyKeys, allowUnsigned bool) error {
	ring, keyFile, err := e.ring(keys)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	pubPath := keys.pubPath + keys.keyringPath
	st, err := e.openStore(ctx)
	if err != nil {
		return err
	}
	defer closeStore(st)

	if err := e.runBeforeTenants(ctx, st, id); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	if _, err := st.Stat(ctx, provenance.ManifestKey(id)); errors.Is(err, store.ErrNotFound) {
		return e.notCommitted(ctx, st, "verify", id, "nothing to verify")
	}
	report, _ := provenance.VerifyKeyring(ctx, st, e.tenant(), id, ring)
	if err := ctx.Err(); err != nil {
		return err
	}
	v := verifyOutput{Verdict: provenance.Decide(report, provenance.Policy{AllowUnsigned: allowUnsigned}), PublicKey: keyFile}
	// The verdict's reasons are provenance's; the flags to change them are this command's.
	for i := range v.Checks {
		c := &v.Checks[i]
		switch {
		case c.Check != "signature":
		case c.SignatureRequired:
			c.Reason += " (give --keyring FILE or --public-key FILE; --allow-unsigned accepts the run on its digests alone)"
		case c.Result == provenance.ResultSkipped:
			c.Reason = "NOT CHECKED: " + c.Reason + "; give --keyring FILE or --public-key FILE to check it"
		case c.Result == provenance.ResultFail && pubPath == "" && keyFile != "":
			c.Reason += fmt.Sprintf(" (the public key is %s, the embedded worker's; give the signer's key with --public-key)", keyFile)
		}
	}
	if len(report.Statement.Subjects) > 0 {
		if v.Unlisted, v.UnlistedMore, err = provenance.UnlistedMore(ctx, st, id, report.Statement); err != nil {
			return fmt.Errorf("verify: %w", err)
		}
	}

	if e.json() {
		if err := e.printJSON(v); err != nil {
			return err
		}
	} else {
		e.printVerdict(v, st.URL(store.RunPrefix(id)))
	}
	switch {
	case len(v.Failed) > 0:
		return &ExitError{Code: exitVerifyFailed, Msg: fmt.Sprintf("job %s failed verification: %s", id, strings.Join(v.Failed, ", "))}
	case len(v.Unreadable) > 0:
		return fmt.Errorf("verify: job %s: could not read %s from the store; nothing was found wrong, but the run is not verified", id, strings.Join(v.Unreadable, ", "))
	case !v.Verified:
		return &ExitError{Code: exitVerifyFailed, Msg: fmt.Sprintf("job %s could not be verified", id)}
	}
	return nil
}

func (e *env) printVerdict(v verifyOutput, where string) {
	w := e.stdout
	printf(w, "job %s in %s\n", v.ID, where)
	switch {
	case v.PublicKey != "":
		printf(w, "public key %s\n", v.PublicKey)
	default:
		fmt.Fprintln(w, "no public key: the signature is not checked")
	}
	width := 0
	for _, c := range v.Checks {
		width = max(width, len(c.File))
	}
	var failed []string
	for _, c := range v.Checks {
		mark := map[string]string{provenance.ResultOK: "ok", provenance.ResultFail: "FAIL", provenance.ResultSkipped: "skip"}[c.Result]
		printf(w, "  %-4s  %-*s  %s\n", mark, width, c.File, c.Reason)
		if c.Result == provenance.ResultFail {
			failed = append(failed, c.File)
		}
	}
	for _, u := range v.Unlisted {
		printf(w, "  note  %-*s  not named by the manifest: nothing vouches for it\n", width, u)
	}
	if v.UnlistedMore {
		printf(w, "  note  %-*s  %s\n", width, "…", unlistedMore)
	}
	switch {
	case len(failed) > 0:
		printf(w, "NOT VERIFIED: %d of %d checks failed: %s\n", len(failed), len(v.Checks), strings.Join(failed, ", "))
	case !v.Verified:
		fmt.Fprintln(w, "NOT VERIFIED")
	case v.Signature == provenance.SignatureVerified:
		printf(w, "verified: every file matches the manifest, and the manifest is signed by key %s (%s)\n", v.KeyName, v.KeyID)
	default:
		fmt.Fprintln(w, "digests verified: every file matches the manifest; the SIGNATURE WAS NOT CHECKED, so the manifest itself is not proven")
	}
}

// publicKey returns the key that checks signatures: the file --public-key names, else
// $BOXCAR_HOME/keys/signing.pub when it exists; nil when there is none. file is where the key
// came from.
func (e *env) publicKey(flagPath string) (key ed25519.PublicKey, file string, err error) {
	if flagPath != "" {
		key, err := provenance.ReadPublicKeyFile(flagPath)
		if err != nil {
			return nil, "", fmt.Errorf("--public-key: %w", err)
		}
		return key, flagPath, nil
	}
	home, err := e.home()
	if err != nil {
		return nil, "", nil // no default place to look
	}
	path := filepath.Join(home, "keys", provenance.PublicKeyFile)
	key, err = provenance.ReadPublicKeyFile(path)
	switch {
	case err == nil:
		return key, path, nil
	case errors.Is(err, fs.ErrNotExist):
		return nil, "", nil
	default:
		return nil, "", fmt.Errorf("the default public key: %w (give another with --public-key)", err)
	}
}
