package submitcmd

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/cli"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/store"
)

func (e *env) getCmd() *cobra.Command {
	var (
		out           string
		keys          verifyKeys
		allowUnsigned bool
	)
	c := &cobra.Command{
		Use:   "get JOB_ID",
		Short: "download the run, checking the manifest's signature and every file against it",
		Long: `Checks the manifest's signature with the keys verify uses (--keyring FILE, else --public-key FILE,
else $BOXCAR_HOME/keys/signing.pub, the embedded worker's), then downloads what the manifest
names, checking each file's SHA-256 and size on the way: a file that does not match is not kept
and fails the command naming it (exit 8); objects the manifest does not name are reported and
not downloaded. A manifest not signed by one of those keys downloads nothing (exit 8);
--allow-unsigned downloads a run that has no signature at all. With no key anywhere the files
are checked against the manifest alone, and get says the signature was not checked.`,
		Args: jobIDArgs(1, 1, "get: give one JOB_ID and --out DIR"),
		RunE: func(c *cobra.Command, a []string) error {
			if out == "" {
				return cli.Usagef("get: give one JOB_ID and --out DIR")
			}
			if keys.keyringPath == "" {
				keys.keyringPath = e.getenv("BOXCAR_KEYRING")
			}
			return e.get(c.Context(), a[0], out, keys, allowUnsigned)
		},
	}
	c.Flags().StringVar(&out, "out", "", "directory to download the run into (`DIR`, required)")
	markRequired(c, "out")
	_ = c.MarkFlagDirname("out")
	signerKeyFlags(c, &keys.pubPath, &keys.keyringPath)
	c.Flags().BoolVar(&allowUnsigned, "allow-unsigned", false, "download a run that has no signature, its files checked against the manifest alone")
	e.common(c, true)
	return c
}

// get downloads a committed run: every file the manifest names, each checked against its
// SHA-256 and size on the way (a file that does not match is not kept), then the manifest and
// its signature. The manifest is held to its job, its tenant and its signature before anything
// is written. Objects under the run's folder that the manifest does not name are reported and
// not downloaded.
func (e *env) get(ctx context.Context, id, out string, keys verifyKeys, allowUnsigned bool) error {
	ring, keyFile, err := e.ring(keys)
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	if keys.pubPath+keys.keyringPath != "" {
		keyFile = "" // given: no hint that it is the embedded worker's
	}
	st, err := e.openStore(ctx)
	if err != nil {
		return err
	}
	defer closeStore(st)

	manifest, stmt, err := e.committedRun(ctx, st, id)
	if err != nil {
		return err
	}
	signer, err := e.getSignature(ctx, st, id, manifest, stmt, signers{ring: ring, embedded: keyFile}, allowUnsigned)
	if err != nil {
		return err
	}

	files, bad, err := e.download(ctx, st, id, out, manifest, stmt)
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	unlisted, err := provenance.Unlisted(ctx, st, id, stmt)
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	for _, u := range unlisted {
		printf(e.stderr, "not downloaded: %s is not named by the manifest; nothing vouches for it\n", u)
	}
	if e.json() {
		if err := e.printJSON(map[string]any{"id": id, "out": out, "files": files, "failed": bad, "unlisted": append([]string{}, unlisted...)}); err != nil {
			return err
		}
	}
	if len(bad) > 0 {
		return &ExitError{Code: exitVerifyFailed, Msg: fmt.Sprintf("get: job %s: %d of %d files do not match the manifest and were not kept: %s",
			id, len(bad), len(stmt.Subjects), strings.Join(bad, ", "))}
	}
	printf(e.stderr, "checked %d files against the manifest's sha256 digests%s; `submit verify %s` also checks the inputs\n", len(stmt.Subjects), signer, id)
	return nil
}

// download writes the files stmt names into out, each checked on the way, and then the
// manifest and its envelope; it returns the paths it kept and the names it refused.
func (e *env) download(ctx context.Context, st store.Store, id, out string, manifest []byte, stmt provenance.Statement) (files, bad []string, err error) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, nil, err
	}
	// Every write goes through the root, so no name and no symlink already in DIR can lead
	// a file outside it.
	root, err := os.OpenRoot(out)
	if err != nil {
		return nil, nil, err
	}
	defer root.Close()
	bad, files = []string{}, []string{}
	// Each file kept is a line on stdout, or with --output json a name in one object at the end.
	kept := func(name string) {
		files = append(files, filepath.Join(out, name))
		if !e.json() {
			printf(e.stdout, "%s\n", filepath.Join(out, name))
		}
	}
	for _, s := range stmt.Subjects {
		err := downloadChecked(ctx, st, root, provenance.SubjectKey(id, s), s)
		switch {
		case err == nil:
			kept(filepath.FromSlash(s.Name))
		case errors.Is(err, provenance.ErrDigestMismatch), errors.Is(err, store.ErrNotFound):
			printf(e.stderr, "FAIL %s: %v\n", s.Name, err)
			bad = append(bad, s.Name)
		default:
			return nil, nil, err
		}
	}
	if err := writeFile(root, "manifest.json", manifest); err != nil {
		return nil, nil, err
	}
	kept("manifest.json")
	env, err := readObject(ctx, st, provenance.SignatureKey(id), maxManifestBytes)
	switch {
	case err == nil:
		if err := writeFile(root, "manifest.dsse.json", env); err != nil {
			return nil, nil, err
		}
		kept("manifest.dsse.json")
	case !errors.Is(err, store.ErrNotFound):
		return nil, nil, err
	}
	return files, bad, nil
}

// committedRun reads the run's manifest and holds it to this job of this tenant; a run that is
// not committed, or whose manifest is another's or no manifest, is an error that says so.
func (e *env) committedRun(ctx context.Context, st store.Store, id string) ([]byte, provenance.Statement, error) {
	manifest, err := readObject(ctx, st, provenance.ManifestKey(id), maxManifestBytes)
	if errors.Is(err, store.ErrNotFound) {
		if err := e.runBeforeTenants(ctx, st, id); err != nil {
			return nil, provenance.Statement{}, fmt.Errorf("get: %w; nothing downloaded", err)
		}
		return nil, provenance.Statement{}, e.notCommitted(ctx, st, "get", id, "nothing downloaded")
	}
	if err != nil {
		return nil, provenance.Statement{}, fmt.Errorf("get: %w", err)
	}
	stmt, err := provenance.Parse(manifest)
	if err == nil {
		err = stmt.CheckRun(e.tenant(), id)
	}
	if err != nil {
		return nil, provenance.Statement{}, &ExitError{Code: exitVerifyFailed, Msg: fmt.Sprintf("get: job %s: manifest.json cannot be trusted: %v; nothing downloaded", id, err)}
	}
	return manifest, stmt, nil
}

// signers are the keys get checks a signature with: ring, and embedded, the file of the
// embedded worker's key when ring is that key by default ("" otherwise).
type signers struct {
	ring     provenance.Keyring
	embedded string
}

// getSignature holds the manifest get is about to follow to its signature by a key of the
// ring, as verify does: whoever may write the store can write a manifest, not sign one. It
// returns what the closing line says of the signature. With no key at hand it checks nothing
// and says so; a run with no signature passes only with allowUnsigned.
func (e *env) getSignature(ctx context.Context, st store.Store, id string, manifest []byte, stmt provenance.Statement, keys signers, allowUnsigned bool) (string, error) {
	const notChecked = ", the signature was NOT CHECKED, so nothing proves the manifest they match"
	ring := keys.ring
	if len(ring) == 0 {
		printf(e.stderr, "get: no public key: the signature was NOT CHECKED (give --keyring FILE or --public-key FILE)\n")
		return notChecked, nil
	}
	key, err := provenance.CheckSignature(ctx, st, id, manifest, stmt, ring)
	switch {
	case err == nil:
		return fmt.Sprintf(", a manifest signed by key %s (%s)", key.Name, provenance.KeyID(key.Key)), nil
	case errors.Is(err, store.ErrNotFound) && allowUnsigned:
		printf(e.stderr, "get: job %s has no signature (--allow-unsigned): NOT CHECKED\n", id)
		return notChecked, nil
	case errors.Is(err, provenance.ErrMissing) && !errors.Is(err, store.ErrNotFound):
		return "", fmt.Errorf("get: job %s: %w; nothing downloaded", id, err)
	case errors.Is(err, store.ErrNotFound):
		return "", &ExitError{Code: exitVerifyFailed, Msg: fmt.Sprintf("get: job %s: %v; nothing downloaded (--allow-unsigned downloads a run that has no signature, its files checked against the manifest alone)", id, err)}
	}
	hint := ""
	if keys.embedded != "" {
		hint = fmt.Sprintf(" (the public key is %s, the embedded worker's; give the signer's key with --public-key or --keyring)", keys.embedded)
	}
	return "", &ExitError{Code: exitVerifyFailed, Msg: fmt.Sprintf("get: job %s: the manifest's signature: %v; nothing downloaded%s", id, err, hint)}
}

// readObject reads a small object whole; larger than max is an error.
func readObject(ctx context.Context, st store.Store, key string, max int64) ([]byte, error) {
	rc, err := st.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, max+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", key, max)
	}
	return data, nil
}

// downloadChecked streams one object into a temporary file under root while hashing it, and
// moves it to its name only when its SHA-256 and size are the ones the manifest records.
func downloadChecked(ctx context.Context, st store.Store, root *os.Root, key string, want provenance.Subject) error {
	rc, err := st.Get(ctx, key)
	if err != nil {
		return err
	}
	defer rc.Close()
	name := filepath.FromSlash(want.Name)
	if dir := path.Dir(want.Name); dir != "." {
		if err := root.MkdirAll(filepath.FromSlash(dir), 0o755); err != nil {
			return err
		}
	}
	tmp := partName(name)
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	defer func() { _ = root.Remove(tmp) }() // gone already after the rename
	h := sha256.New()
	// One byte past the recorded size is enough to tell a longer object.
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(rc, want.Size+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("download %s: %w", key, err)
	}
	if n > want.Size {
		return fmt.Errorf("%w: %s is longer than the %d bytes the manifest records", provenance.ErrDigestMismatch, key, want.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want.SHA256 || n != want.Size {
		return fmt.Errorf("%w: %s is sha256 %s, %d bytes; the manifest records %s, %d bytes", provenance.ErrDigestMismatch, key, got, n, want.SHA256, want.Size)
	}
	return root.Rename(tmp, name)
}

func writeFile(root *os.Root, name string, data []byte) error {
	tmp := partName(name)
	if err := root.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := root.Rename(tmp, name); err != nil {
		_ = root.Remove(tmp)
		return err
	}
	return nil
}

// partName is the temporary name a file is written under before it gets name, in name's
// folder: of a length of its own, as the job chose name's, up to NAME_MAX.
func partName(name string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return filepath.Join(filepath.Dir(name), ".boxcar-part-"+hex.EncodeToString(b[:]))
}
