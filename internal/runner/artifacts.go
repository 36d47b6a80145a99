package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"

	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
)

// maxArtifactName bounds an artifact's name in bytes, so that its store key (runs/<id>/ and a
// bucket prefix before it) stays within S3's 1024 bytes.
const maxArtifactName = 512

// reservedPrefix starts names the file store keeps for its temporary files; an artifact so
// named could not be stored.
const reservedPrefix = ".boxcar-tmp-"

// collectArtifacts lists the files the job left in the profile's artifact folder, to be
// stored as artifacts/<path inside the folder> and named in the manifest. It reads none of
// them: the commit streams each from the sandbox to the store (sandbox.Open), so no artifact
// is ever held in the worker's memory.
//
// Only regular files are taken: the sandbox lists without following symlinks, and Open
// follows none either, so a link (to a host file, an input, another folder) is neither listed
// nor uploaded, and neither is a file changed into one after the listing. At most
// maxArtifacts files are taken, each of at most maxArtifactBytes and together at most
// maxArtifactTotal, in name order. Whatever the job did (a file too large, a size below 0 in
// the listing, a name the store cannot hold, a folder nested past PATH_MAX or unreadable, an
// artifact folder that is a file or a link, and at the upload a file that changed or became a
// link) leaves that file or folder out, named in c for the manifest (skip), and never fails
// the run. Of names that a file system folding case or Unicode normalization (macOS, Windows)
// holds as one file, only the first is taken (provenance.Names), so every run can be fetched
// whole on such a machine (submit get). err is only ever the context's.
func (r *Runner) collectArtifacts(ctx context.Context, a *attempt, sb sandbox.Sandbox, c *provenance.Collected) ([]output, error) {
	dir, err := sandbox.CleanPath(a.profile.Artifacts)
	if err != nil {
		a.log.WarnContext(ctx, "the profile's artifact folder is not a path inside the workdir; no artifacts uploaded",
			"artifacts", a.profile.Artifacts, "error", err)
		return nil, nil
	}
	files, err := sb.List(ctx, dir)
	var incomplete *sandbox.IncompleteError
	switch {
	case err == nil:
	case ctx.Err() != nil, errors.Is(err, sandbox.ErrSandboxLost):
		return nil, fmt.Errorf("list artifacts %s: %w", dir, err)
	case errors.Is(err, sandbox.ErrNotFound):
		return nil, nil
	case errors.As(err, &incomplete):
		for _, s := range incomplete.Skipped {
			skip(c, s.Path, "unreadable", s.Reason)
		}
		c.SkippedMore += incomplete.More
		a.log.WarnContext(ctx, "folders of the artifact folder cannot be read; they are left out", "artifacts", dir, "error", err)
	case errors.Is(err, sandbox.ErrPathEscape):
		skip(c, dir, "unreadable", "a link out of the workdir")
		a.log.WarnContext(ctx, "the artifact folder is a link out of the workdir; no artifacts uploaded", "artifacts", dir)
		return nil, nil
	case errors.Is(err, sandbox.ErrNotDir):
		skip(c, dir, "unreadable", "not a folder")
		a.log.WarnContext(ctx, "the artifact folder is a file; no artifacts uploaded", "artifacts", dir)
		return nil, nil
	default:
		skip(c, dir, "unreadable", fileProblem(err))
		a.log.WarnContext(ctx, "the artifact folder cannot be listed; no artifacts uploaded", "artifacts", dir, "error", err)
		return nil, nil
	}

	prefix := dir + "/"
	if dir == "." {
		prefix = ""
	}
	var (
		outs  []output
		total int64
		taken provenance.Names
	)
	for i, f := range files {
		if len(outs) == maxArtifacts {
			a.log.WarnContext(ctx, "artifact count cap reached; the rest are not uploaded",
				"kept", maxArtifacts, "found", len(files), "first_left_out", sandbox.ShortPath(f.Path, maxNamedPath), "left_out", len(files)-i)
			for _, rest := range files[i:] {
				skip(c, rest.Path, "count_cap", fmt.Sprintf("more than %d artifacts", maxArtifacts))
			}
			break
		}
		rel, ok := strings.CutPrefix(f.Path, prefix)
		name := "artifacts/" + rel
		if !ok || !artifactName(name) {
			skip(c, f.Path, "bad_name", "not a name the store and the manifest can hold")
			a.log.WarnContext(ctx, "artifact name cannot be stored; not uploaded", "artifact", sandbox.ShortPath(f.Path, maxNamedPath))
			continue
		}
		if f.Size < 0 {
			// No file has a negative size: a backend that passed one on would otherwise have it
			// pass the size cap and lower the total, letting through more than the total cap.
			skip(c, f.Path, "unreadable", fmt.Sprintf("listed with a size of %d bytes", f.Size))
			a.log.WarnContext(ctx, "artifact listed with a negative size; not uploaded", "artifact", f.Path, "size_bytes", f.Size)
			continue
		}
		budget := min(maxArtifactBytes, maxArtifactTotal-total)
		if f.Size > budget {
			skip(c, f.Path, "too_large", fmt.Sprintf("%d bytes; at most %d each and %d together", f.Size, maxArtifactBytes, maxArtifactTotal))
			a.log.WarnContext(ctx, "artifact too large; not uploaded", "artifact", f.Path, "size_bytes", f.Size,
				"max_artifact_bytes", maxArtifactBytes, "max_total_bytes", maxArtifactTotal, "total_bytes", total)
			continue
		}
		// Taken in name order: of names a client's file system would hold as one file, the
		// first is kept on every worker alike, and submit get can write every run a worker commits.
		if other := taken.Add(name); other != "" {
			skip(c, f.Path, "bad_name", fmt.Sprintf("one file with %s where names ignore case, Unicode normalization or trailing dots and spaces (macOS, Windows)", other))
			a.log.WarnContext(ctx, "artifact name is another's where names fold; not uploaded", "artifact", sandbox.ShortPath(f.Path, maxNamedPath), "kept", sandbox.ShortPath(other, maxNamedPath))
			continue
		}
		// Read as listed: the listed size bounds the read, so a file that grew since it was
		// listed cannot push past the caps, and the upload (commit) leaves out one that
		// changed.
		path, size := f.Path, f.Size
		total += size
		outs = append(outs, output{name: name, size: size, path: path, open: func(ctx context.Context) (io.ReadCloser, error) {
			return sb.Open(ctx, path, size)
		}})
	}
	return outs, nil
}

// artifactName reports whether name can be a store key and a manifest subject: a key the store
// writes and lists back as itself (store.WritableKey: valid UTF-8, no control character, nor
// U+FFFE, U+FFFF or a backslash), without format characters, not too long, and no part the
// file store reserves.
func artifactName(name string) bool {
	if len(name) > maxArtifactName || !store.WritableKey(name) {
		return false
	}
	// Format characters (an RTL override, zero-width characters) make a name display as
	// another one; line separators break the lines it is printed on.
	if strings.ContainsFunc(name, func(r rune) bool {
		return unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
	}) {
		return false
	}
	for part := range strings.SplitSeq(name, "/") {
		if strings.HasPrefix(part, reservedPrefix) {
			return false
		}
	}
	return true
}
