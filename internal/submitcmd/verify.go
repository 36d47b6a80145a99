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

	"github.com/boxcar-run/boxcar/internal/job"
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
}

func (e *env) verifyCmd() *cobra.Command {
	var (
		pubPath string
		require bool
	)
	c := &cobra.Command{
		Use:   "verify JOB_ID",
		Short: "check the run against its manifest and the manifest's signature",
		Long: `Checks that the manifest is Boxcar provenance for this job, that the envelope's signature covers
the stored manifest, and re-hashes every subject and input. Exit 0: verified; 8: a check failed;
1: the store could not be read, so nothing was decided. Default key:
$BOXCAR_HOME/keys/signing.pub, the embedded worker's.`,
		Args: args(1, 1, "verify: give one JOB_ID"),
		RunE: func(c *cobra.Command, a []string) error { return e.verify(c.Context(), a[0], pubPath, require) },
	}
	c.Flags().StringVar(&pubPath, "public-key", "", "ed25519 public key (PEM) of the worker that signs (default: $BOXCAR_HOME/keys/signing.pub, the embedded worker's, when it exists) (`FILE`)")
	c.Flags().BoolVar(&require, "require-signature", false, "fail when no public key is available to check the signature")
	_ = c.MarkFlagFilename("public-key", "pub", "pem")
	e.common(c, true)
	return c
}

func (e *env) verify(ctx context.Context, id, pubPath string, require bool) error {
	if !job.ValidID(id) {
		return errors.New("verify: give one JOB_ID")
	}
	pub, keyFile, err := e.publicKey(pubPath)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	st, err := e.openStore(ctx)
	if err != nil {
		return err
	}
	defer closeStore(st)

	report, _ := provenance.Verify(ctx, st, id, pub)
	if err := ctx.Err(); err != nil {
		return err
	}
	v := verifyOutput{Verdict: provenance.Decide(report, provenance.Policy{RequireSignature: require}), PublicKey: keyFile}
	// The verdict's reasons are provenance's; the flags to change them are this command's.
	for i := range v.Checks {
		c := &v.Checks[i]
		switch {
		case c.Check != "signature":
		case c.SignatureRequired:
			c.Reason += "; --require-signature demands one (give --public-key FILE)"
		case c.Result == provenance.ResultSkipped:
			c.Reason = "NOT CHECKED: " + c.Reason + "; give --public-key FILE to check it"
		case c.Result == provenance.ResultFail && pubPath == "" && keyFile != "":
			c.Reason += fmt.Sprintf(" (the public key is %s, the embedded worker's; give the signer's key with --public-key)", keyFile)
		}
	}
	if len(report.Statement.Subjects) > 0 {
		if v.Unlisted, err = provenance.Unlisted(ctx, st, id, report.Statement); err != nil {
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
	switch {
	case len(failed) > 0:
		printf(w, "NOT VERIFIED: %d of %d checks failed: %s\n", len(failed), len(v.Checks), strings.Join(failed, ", "))
	case !v.Verified:
		fmt.Fprintln(w, "NOT VERIFIED")
	case v.Signature == provenance.SignatureVerified:
		printf(w, "verified: every file matches the manifest, and the manifest is signed by key %s\n", v.KeyID)
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
