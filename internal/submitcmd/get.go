package submitcmd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/cli"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/store"
)

func (e *env) getCmd() *cobra.Command {
	var (
		out   string
		trust trustFlags
	)
	c := &cobra.Command{
		Use:   "get JOB_ID",
		Short: "download the run, checking the manifest's signature and every file against it",
		Long: `Checks the manifest's signature with the keys verify uses (--keyring FILE, else --public-key FILE,
else $BOXCAR_HOME/keys/signing.pub, the embedded worker's), then downloads what the manifest
names, checking each file's SHA-256 and size on the way: a file that does not match is not kept
and fails the command naming it (exit 8); objects the manifest does not name are reported and
not downloaded. DIR must be new or empty, and get writes over no file. A manifest not signed
by one of those keys downloads nothing (exit 8);
--allow-unsigned downloads a run that has no signature at all. With no key anywhere the files
are checked against the manifest alone, and get says the signature was not checked.`,
		Args: jobIDArgs(1, 1, "get: give one JOB_ID and --out DIR"),
		RunE: func(c *cobra.Command, a []string) error {
			if out == "" {
				return cli.Usagef("get: give one JOB_ID and --out DIR")
			}
			return e.get(c.Context(), a[0], out, trust)
		},
	}
	c.Flags().StringVar(&out, "out", "", "new or empty directory to download the run into (`DIR`, required)")
	markRequired(c, "out")
	_ = c.MarkFlagDirname("out")
	trust.add(c, "download a run that has no signature, its files checked against the manifest alone")
	e.common(c, true)
	return c
}

// get downloads a committed run: every file the manifest names, each checked against its
// SHA-256 and size on the way (a file that does not match is not kept), then the manifest and
// its signature. The manifest is held to its job, its tenant and its signature before anything
// is written (trustedRun). Objects under the run's folder that the manifest does not name are
// reported and not downloaded.
func (e *env) get(ctx context.Context, id, out string, trust trustFlags) error {
	keys, err := e.signers(getReader, trust)
	if err != nil {
		return err
	}
	st, err := e.openStore(ctx)
	if err != nil {
		return err
	}
	defer closeStore(st)

	run, err := e.trustedRun(ctx, st, getReader, id, keys, trust.allowUnsigned)
	if err != nil {
		return err
	}
	stmt := run.stmt
	if err := oneFileEach(stmt.Subjects); err != nil {
		return fmt.Errorf("get: job %s: %w; nothing downloaded (`submit verify %s` checks the run in the store)", id, err, id)
	}
	if err := newFolder(out); err != nil {
		return fmt.Errorf("get: %w; nothing downloaded", err)
	}
	if err := roomFor(out, totalSize(stmt.Subjects)+int64(len(run.manifest))); err != nil {
		return fmt.Errorf("get: job %s: the run's files: %w; give --out a folder with room (`submit verify %s` checks the sizes the manifest records); nothing downloaded", id, err, id)
	}
	files, bad, err := e.download(ctx, st, id, out, run)
	if err != nil {
		return fmt.Errorf("get: %w; nothing kept: --out %s is as it was, run get again", err, out)
	}
	unlisted, more, err := provenance.UnlistedMore(ctx, st, id, stmt)
	if err != nil {
		return fmt.Errorf("get: job %s is downloaded into %s, but the objects its manifest does not name could not be listed: %w; `submit verify %s` lists them", id, out, err, id)
	}
	for _, u := range unlisted {
		printf(e.stderr, "not downloaded: %s is not named by the manifest; nothing vouches for it\n", u)
	}
	if more {
		printf(e.stderr, "not downloaded: %s\n", unlistedMore)
	}
	if e.json() {
		if err := e.printJSON(map[string]any{"id": id, "out": out, "files": files, "failed": bad, "unlisted": append([]string{}, unlisted...), "unlisted_more": more}); err != nil {
			return err
		}
	}
	if len(bad) > 0 {
		return &ExitError{Code: exitVerifyFailed, Msg: fmt.Sprintf("get: job %s: %d of %d files do not match the manifest and were not kept: %s",
			id, len(bad), len(stmt.Subjects), strings.Join(bad, ", "))}
	}
	printf(e.stderr, "checked %d files against the manifest's sha256 digests%s; `submit verify %s` also checks the inputs\n", len(stmt.Subjects), run.signer, id)
	return nil
}

// download writes the files the run's manifest names into out, each checked on the way, and
// then the manifest and its envelope, the bytes trustedRun read and checked; it returns the paths it kept and the names it refused. A download
// that does not finish (Ctrl-C, the store gone, a file that cannot be written) removes what
// it wrote, out too when it made it: the files kept so far, with no manifest beside them,
// would look like a download, and the next get would refuse the folder as holding them.
func (e *env) download(ctx context.Context, st store.Store, id, out string, run trustedRun) (files, bad []string, err error) {
	_, statErr := os.Stat(out)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, nil, err
	}
	// Every write goes through the root, so no name and no symlink already in DIR can lead
	// a file outside it.
	root, err := os.OpenRoot(out)
	if err != nil {
		return nil, nil, err
	}
	var written []string
	defer func() {
		if err != nil {
			unwrite(root, written)
		}
		root.Close()
		if err != nil && errors.Is(statErr, fs.ErrNotExist) {
			_ = os.Remove(out) // made here; left when anything else is in it
		}
	}()
	bad, files = []string{}, []string{}
	// Each file kept is a line on stdout, or with --output json a name in one object at the end.
	kept := func(name string) {
		written = append(written, name)
		files = append(files, filepath.Join(out, name))
		if !e.json() {
			printf(e.stdout, "%s\n", filepath.Join(out, name))
		}
	}
	for _, s := range run.stmt.Subjects {
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
	if err := writeFile(root, "manifest.json", run.manifest); err != nil {
		return nil, nil, err
	}
	kept("manifest.json")
	if run.envelope != nil {
		if err := writeFile(root, "manifest.dsse.json", run.envelope); err != nil {
			return nil, nil, err
		}
		kept("manifest.dsse.json")
	}
	return files, bad, nil
}

// unlistedMore says that a run's folder holds more objects the manifest does not name than
// get and verify list (provenance.MaxUnlisted).
var unlistedMore = fmt.Sprintf("and more objects the manifest does not name, not listed past the first %d: nothing vouches for them (a worker leaves none; someone wrote them into the store)", provenance.MaxUnlisted)

// unwrite removes the files names (as the OS writes them) from root, and then the folders
// above them that are left empty, the deepest first.
func unwrite(root *os.Root, names []string) {
	folders := map[string]bool{}
	for _, name := range names {
		_ = root.Remove(name)
		for dir := filepath.Dir(name); dir != "."; dir = filepath.Dir(dir) {
			folders[dir] = true
		}
	}
	deepest := slices.SortedFunc(maps.Keys(folders), func(a, b string) int { return len(b) - len(a) })
	for _, dir := range deepest {
		_ = root.Remove(dir) // one that holds anything stays
	}
}

// newFolder returns nil when dir is not there or empty: get writes a run only into a folder
// of its own. Into one that holds files (--out ., a project's folder, an earlier download) the
// job's names (artifacts/…, chosen by the job) would land among the user's, over them, and the
// folder would hold files no manifest names beside the run's.
func newFolder(dir string) error {
	f, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	switch {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil:
		return fmt.Errorf("--out %s: %w", dir, err)
	}
	return fmt.Errorf("--out %s already holds %s: give a new or empty folder (get writes over no file)", dir, names[0])
}

// oneFileEach returns an error naming two of the run's files that a file system which folds
// names (provenance.FoldedName) would hold in one place, the second replacing the first. It is
// decided by the names alone, the same on every machine: whether --out folds names cannot be
// told before writing into it, and a file written under another name than the manifest's is
// one the manifest does not name, so get refuses the run rather than rename a file in it.
func oneFileEach(subjects []provenance.Subject) error {
	var names provenance.Names
	for _, s := range subjects {
		if other := names.Add(s.Name); other != "" {
			return fmt.Errorf("%s and %s would be one file where names ignore case, Unicode normalization or trailing dots and spaces (macOS, Windows), one replacing the other", other, s.Name)
		}
	}
	return nil
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

// downloadChecked streams one object into a temporary file under root while checking it, and
// moves it to its name only when its SHA-256 and size are the ones the manifest records.
func downloadChecked(ctx context.Context, st store.Store, root *os.Root, key string, want provenance.Subject) error {
	rc, err := st.Get(ctx, key)
	if err != nil {
		return err
	}
	defer rc.Close()
	return writeNew(root, want.Name, func(w io.Writer) error {
		return provenance.CopyChecked(w, rc, key, want.SHA256, want.Size)
	})
}

func writeFile(root *os.Root, name string, data []byte) error {
	return writeNew(root, name, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// writeNew creates the file name (slash-separated) under root with what fill writes, or
// leaves nothing of it when fill fails. get never writes over a file: name is claimed first,
// created empty where nothing is (where a file system folds names, nothing of a name it
// folds with either), and the content, written under a temporary name beside it, takes its
// place once whole.
func writeNew(root *os.Root, name string, fill func(io.Writer) error) (err error) {
	name = filepath.FromSlash(name)
	if dir := filepath.Dir(name); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	claim, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_ = claim.Close()
	tmp := partName(name)
	defer func() {
		_ = root.Remove(tmp) // gone already after the rename
		if err != nil {
			_ = root.Remove(name)
		}
	}()
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	err = fill(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return root.Rename(tmp, name)
}

// partName is the temporary name a file is written under before it gets name, in name's
// folder: of a length of its own, as the job chose name's, up to NAME_MAX.
func partName(name string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return filepath.Join(filepath.Dir(name), ".boxcar-part-"+hex.EncodeToString(b[:]))
}
