package submitcmd

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/store"
)

// exitVerifyFailed is the exit code of verify and get when the run does not match its
// manifest: a file changed or missing, a signature that does not verify, a manifest that is
// absent or not Boxcar provenance.
const exitVerifyFailed = 8

// verifyCheck is one line of the verdict, stable for scripts (--output json).
type verifyCheck struct {
	File   string `json:"file"`   // what was checked: manifest.json, manifest.dsse.json, report.md, input sales.csv …
	Key    string `json:"key"`    // the object's key in the store
	Check  string `json:"check"`  // provenance's name for the check: "manifest", "subject report.md", "input sales.csv"
	Result string `json:"result"` // ok, fail or skipped
	Reason string `json:"reason"`

	err error
}

// verdict is what verify prints.
type verdict struct {
	ID        string        `json:"id"`
	Verified  bool          `json:"verified"`
	Signature string        `json:"signature"` // verified, failed or not_checked
	KeyID     string        `json:"key_id,omitempty"`
	PublicKey string        `json:"public_key,omitempty"` // the file the key came from
	Checks    []verifyCheck `json:"checks"`
	// Unlisted are objects under the run's folder that the manifest does not name: nothing
	// vouches for them. They do not fail verification.
	Unlisted []string `json:"unlisted,omitempty"`
}

func (e *env) verify(ctx context.Context, args []string) error {
	fs := e.flags("verify")
	pubPath := fs.String("public-key", "", "ed25519 public key (PEM) of the worker that signs (default: $BOXCAR_HOME/keys/signing.pub, the embedded worker's, when it exists)")
	require := fs.Bool("require-signature", false, "fail when no public key is available to check the signature")
	rest, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 || !job.ValidID(rest[0]) {
		return errors.New("verify: give one JOB_ID")
	}
	id := rest[0]
	pub, keyFile, err := e.publicKey(*pubPath)
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
	v := verdict{ID: id, Signature: "not_checked", KeyID: report.KeyID, PublicKey: keyFile}
	for _, c := range report.Checks {
		file, key := checkFile(c.Name, id, report.Statement)
		vc := verifyCheck{File: file, Key: key, Check: c.Name, Reason: c.Reason, err: c.Err}
		switch {
		case c.OK:
			vc.Result = "ok"
		case c.Skipped:
			vc.Result = "skipped"
		default:
			vc.Result = "fail"
		}
		if c.Name == "signature" {
			switch {
			case c.OK:
				v.Signature = "verified"
			case c.Skipped && *require:
				vc.Result = "fail"
				vc.Reason = "not checked: no public key; --require-signature demands one (give --public-key FILE)"
				vc.err = provenance.ErrUnsigned
				v.Signature = "failed"
			case c.Skipped:
				vc.Reason = "NOT CHECKED: " + vc.Reason + "; give --public-key FILE to check it"
			default:
				v.Signature = "failed"
				if *pubPath == "" && keyFile != "" {
					vc.Reason += fmt.Sprintf(" (the public key is %s, the embedded worker's; give the signer's key with --public-key)", keyFile)
				}
			}
		}
		v.Checks = append(v.Checks, vc)
	}
	if len(report.Statement.Subjects) > 0 {
		unlisted, err := unlistedObjects(ctx, st, id, report.Statement)
		if err != nil {
			return fmt.Errorf("verify: %w", err)
		}
		v.Unlisted = unlisted
	}

	var failed, unreadable []string
	for _, c := range v.Checks {
		if c.Result != "fail" {
			continue
		}
		// An object the store could not serve, for another reason than its absence, proves
		// nothing either way.
		if errors.Is(c.err, provenance.ErrMissing) && !errors.Is(c.err, store.ErrNotFound) {
			unreadable = append(unreadable, c.File)
			continue
		}
		failed = append(failed, c.File)
	}
	v.Verified = len(v.Checks) > 0 && len(failed) == 0 && len(unreadable) == 0

	if e.output == "json" {
		if err := e.printJSON(v); err != nil {
			return err
		}
	} else {
		e.printVerdict(v, st.URL(store.RunPrefix(id)))
	}
	switch {
	case len(failed) > 0:
		return &ExitError{Code: exitVerifyFailed, Msg: fmt.Sprintf("job %s failed verification: %s", id, strings.Join(failed, ", "))}
	case len(unreadable) > 0:
		return fmt.Errorf("verify: job %s: could not read %s from the store; nothing was found wrong, but the run is not verified", id, strings.Join(unreadable, ", "))
	case !v.Verified:
		return &ExitError{Code: exitVerifyFailed, Msg: fmt.Sprintf("job %s could not be verified", id)}
	}
	return nil
}

func (e *env) printVerdict(v verdict, where string) {
	w := e.stdout
	fmt.Fprintf(w, "job %s in %s\n", v.ID, where)
	switch {
	case v.PublicKey != "":
		fmt.Fprintf(w, "public key %s\n", v.PublicKey)
	default:
		fmt.Fprintln(w, "no public key: the signature is not checked")
	}
	width := 0
	for _, c := range v.Checks {
		width = max(width, len(c.File))
	}
	for _, c := range v.Checks {
		mark := map[string]string{"ok": "ok", "fail": "FAIL", "skipped": "skip"}[c.Result]
		fmt.Fprintf(w, "  %-4s  %-*s  %s\n", mark, width, c.File, c.Reason)
	}
	for _, u := range v.Unlisted {
		fmt.Fprintf(w, "  note  %-*s  not named by the manifest: nothing vouches for it\n", width, u)
	}
	var failed []string
	for _, c := range v.Checks {
		if c.Result == "fail" {
			failed = append(failed, c.File)
		}
	}
	switch {
	case len(failed) > 0:
		fmt.Fprintf(w, "NOT VERIFIED: %d of %d checks failed: %s\n", len(failed), len(v.Checks), strings.Join(failed, ", "))
	case !v.Verified:
		fmt.Fprintln(w, "NOT VERIFIED")
	case v.Signature == "verified":
		fmt.Fprintf(w, "verified: every file matches the manifest, and the manifest is signed by key %s\n", v.KeyID)
	default:
		fmt.Fprintln(w, "digests verified: every file matches the manifest; the SIGNATURE WAS NOT CHECKED, so the manifest itself is not proven")
	}
}

// checkFile names what a check of provenance.Verify looked at, for people ("report.md",
// "input sales.csv"), and the store key of that object.
func checkFile(name, id string, stmt provenance.Statement) (file, key string) {
	switch {
	case name == "manifest":
		return "manifest.json", store.ManifestKey(id)
	case name == "signature":
		return "manifest.dsse.json", store.SignatureKey(id)
	case strings.HasPrefix(name, "subject "):
		file = strings.TrimPrefix(name, "subject ")
		return file, store.RunPrefix(id) + file
	case strings.HasPrefix(name, "input "):
		in := strings.TrimPrefix(name, "input ")
		for _, i := range stmt.Predicate.Inputs {
			if i.Name == in {
				return name, store.InputKey(i.SHA256)
			}
		}
	}
	return name, ""
}

// unlistedObjects returns the objects under the run's folder that the manifest does not name,
// other than the manifest and its signature.
func unlistedObjects(ctx context.Context, st store.Store, id string, stmt provenance.Statement) ([]string, error) {
	keys, err := st.List(ctx, store.RunPrefix(id))
	if err != nil {
		return nil, err
	}
	named := map[string]bool{"manifest.json": true, "manifest.dsse.json": true}
	for _, s := range stmt.Subjects {
		named[s.Name] = true
	}
	var out []string
	for _, k := range keys {
		if rel := strings.TrimPrefix(k, store.RunPrefix(id)); !named[rel] {
			out = append(out, rel)
		}
	}
	return out, nil
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

// home is $BOXCAR_HOME, else ~/.boxcar.
func (e *env) home() (string, error) {
	if h := e.getenv("BOXCAR_HOME"); h != "" {
		return h, nil
	}
	h, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(h, ".boxcar"), nil
}

// closeStore releases a store that holds resources (both backends do).
func closeStore(st store.Store) {
	if c, ok := st.(io.Closer); ok {
		_ = c.Close()
	}
}
