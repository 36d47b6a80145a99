package submitcmd

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/store"
)

// runReader is a command that shows what a committed run holds (get, logs): its name, and
// what it says it did not do when it refuses the run. Both hold the run to the same checks,
// here, so that neither trusts what the other refuses.
type runReader struct {
	cmd      string // "get"
	nothing  string // "nothing downloaded"
	unsigned string // what --allow-unsigned does, after its name
}

var (
	getReader = runReader{cmd: "get", nothing: "nothing downloaded",
		unsigned: "downloads a run that has no signature, its files checked against the manifest alone"}
	logsReader = runReader{cmd: "logs", nothing: "nothing of its transcript shown",
		unsigned: "shows a run that has no signature, its transcript checked against the manifest alone"}
)

// trustFlags are a run reader's keys (verify's) and --allow-unsigned.
type trustFlags struct {
	keys          verifyKeys
	allowUnsigned bool
}

// add gives c the flags; unsigned says what --allow-unsigned lets the command do.
func (f *trustFlags) add(c *cobra.Command, unsigned string) {
	signerKeyFlags(c, &f.keys.pubPath, &f.keys.keyringPath)
	c.Flags().BoolVar(&f.allowUnsigned, "allow-unsigned", false, unsigned)
}

// signers are the keys a run reader checks a signature with: ring, and embedded, the file of
// the embedded worker's key when ring is that key by default ("" otherwise).
type signers struct {
	ring     provenance.Keyring
	embedded string
}

// signers reads the keys f names, as verify does: --keyring (else $BOXCAR_KEYRING), else
// --public-key, else the embedded worker's.
func (e *env) signers(r runReader, f trustFlags) (signers, error) {
	if f.keys.keyringPath == "" {
		f.keys.keyringPath = e.getenv("BOXCAR_KEYRING")
	}
	ring, keyFile, err := e.ring(f.keys)
	if err != nil {
		return signers{}, fmt.Errorf("%s: %w", r.cmd, err)
	}
	if f.keys.pubPath+f.keys.keyringPath != "" {
		keyFile = "" // given: no hint that it is the embedded worker's
	}
	return signers{ring: ring, embedded: keyFile}, nil
}

// trustedRun is a committed run that a reader may show: its manifest as stored and parsed,
// its envelope as read (nil for none), and what the reader's closing line says of the
// signature. Each is read once: get writes these bytes, so what it writes is what was checked,
// whatever a writer of the store puts there meanwhile.
type trustedRun struct {
	manifest []byte
	envelope []byte
	stmt     provenance.Statement
	signer   string
}

// trustedRun reads the run's manifest and holds it to this job of this tenant and to its
// signature by a key of keys before the reader shows or writes anything of the run.
func (e *env) trustedRun(ctx context.Context, st store.Store, r runReader, id string, keys signers, allowUnsigned bool) (trustedRun, error) {
	manifest, stmt, err := e.committedRun(ctx, st, r, id)
	if err != nil {
		return trustedRun{}, err
	}
	signer, envelope, err := e.runSignature(ctx, st, r, id, manifest, stmt, keys, allowUnsigned)
	if err != nil {
		return trustedRun{}, err
	}
	return trustedRun{manifest: manifest, envelope: envelope, stmt: stmt, signer: signer}, nil
}

// committedRun reads the run's manifest and holds it to this job of this tenant; a run that is
// not committed, or whose manifest is another's or no manifest, is an error that says so.
func (e *env) committedRun(ctx context.Context, st store.Store, r runReader, id string) ([]byte, provenance.Statement, error) {
	manifest, err := readObject(ctx, st, provenance.ManifestKey(id), maxManifestBytes)
	if errors.Is(err, store.ErrNotFound) {
		if err := e.runBeforeTenants(ctx, st, id); err != nil {
			return nil, provenance.Statement{}, fmt.Errorf("%s: %w; %s", r.cmd, err, r.nothing)
		}
		return nil, provenance.Statement{}, e.notCommitted(ctx, st, r.cmd, id, r.nothing)
	}
	if err != nil {
		return nil, provenance.Statement{}, fmt.Errorf("%s: %w", r.cmd, err)
	}
	stmt, err := provenance.Parse(manifest)
	if err == nil {
		err = stmt.CheckRun(e.tenant(), id)
	}
	if err != nil {
		return nil, provenance.Statement{}, &ExitError{Code: exitVerifyFailed, Msg: fmt.Sprintf("%s: job %s: manifest.json cannot be trusted: %v; %s", r.cmd, id, err, r.nothing)}
	}
	return manifest, stmt, nil
}

// runSignature holds the manifest a reader is about to follow to its signature by a key of
// the ring, as verify does: whoever may write the store can write a manifest, not sign one. It
// returns what the closing line says of the signature and the envelope as read, nil when there
// is none. With no key at hand it checks nothing and says so; a run with no signature passes
// only with allowUnsigned.
func (e *env) runSignature(ctx context.Context, st store.Store, r runReader, id string, manifest []byte, stmt provenance.Statement, keys signers, allowUnsigned bool) (string, []byte, error) {
	const notChecked = ", the signature was NOT CHECKED, so nothing proves the manifest they match"
	if len(keys.ring) == 0 {
		printf(e.stderr, "%s: no public key: the signature was NOT CHECKED (give --keyring FILE or --public-key FILE)\n", r.cmd)
		envelope, err := readObject(ctx, st, provenance.SignatureKey(id), maxManifestBytes)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return "", nil, fmt.Errorf("%s: job %s: %w; %s", r.cmd, id, err, r.nothing)
		}
		return notChecked, envelope, nil
	}
	key, envelope, err := provenance.CheckSignature(ctx, st, id, manifest, stmt, keys.ring)
	switch {
	case err == nil:
		return fmt.Sprintf(", a manifest signed by key %s (%s)", key.Name, provenance.KeyID(key.Key)), envelope, nil
	case errors.Is(err, store.ErrNotFound) && allowUnsigned:
		printf(e.stderr, "%s: job %s has no signature (--allow-unsigned): NOT CHECKED\n", r.cmd, id)
		return notChecked, nil, nil
	case errors.Is(err, provenance.ErrMissing) && !errors.Is(err, store.ErrNotFound):
		return "", nil, fmt.Errorf("%s: job %s: %w; %s", r.cmd, id, err, r.nothing)
	case errors.Is(err, store.ErrNotFound):
		return "", nil, &ExitError{Code: exitVerifyFailed, Msg: fmt.Sprintf("%s: job %s: %v; %s (--allow-unsigned %s)", r.cmd, id, err, r.nothing, r.unsigned)}
	}
	hint := ""
	if keys.embedded != "" {
		hint = fmt.Sprintf(" (the public key is %s, the embedded worker's; give the signer's key with --public-key or --keyring)", keys.embedded)
	}
	return "", nil, &ExitError{Code: exitVerifyFailed, Msg: fmt.Sprintf("%s: job %s: the manifest's signature: %v; %s%s", r.cmd, id, err, r.nothing, hint)}
}
