package runner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
)

// maxArtifactName bounds an artifact's name in bytes, so that its store key (runs/<id>/ and a
// bucket prefix before it) stays within S3's 1024 bytes.
const maxArtifactName = 512

// reservedPrefix starts names the file store keeps for its temporary files; an artifact so
// named could not be stored.
const reservedPrefix = ".boxcar-tmp-"

// collectArtifacts reads the files the job left in the profile's artifact folder, to be stored
// as artifacts/<path inside the folder> and named in the manifest.
//
// Only regular files are taken: the sandbox lists without following symlinks, so a link (to a
// host file, an input, another folder) is neither listed nor uploaded. At most maxArtifacts
// files are taken, each of at most maxArtifactBytes and together at most maxArtifactTotal, in
// name order. What the job did wrong (a file too large, a name the store cannot hold, a file
// changed into a link while being read, an artifact folder that is a file or a link) leaves
// that file out with a warning and never fails the run; only a failure of the sandbox itself
// does, so the job is retried.
func (r *Runner) collectArtifacts(ctx context.Context, a *attempt, sb sandbox.Sandbox) ([]output, error) {
	dir, err := sandbox.CleanPath(a.profile.Artifacts)
	if err != nil {
		a.log.WarnContext(ctx, "the profile's artifact folder is not a path inside the workdir; no artifacts uploaded",
			"artifacts", a.profile.Artifacts, "error", err)
		return nil, nil
	}
	files, err := sb.List(ctx, dir)
	switch {
	case err == nil:
	case errors.Is(err, sandbox.ErrNotFound):
		return nil, nil
	case errors.Is(err, sandbox.ErrPathEscape):
		a.log.WarnContext(ctx, "the artifact folder is a link out of the workdir; no artifacts uploaded", "artifacts", dir)
		return nil, nil
	case errors.Is(err, sandbox.ErrNotDir):
		a.log.WarnContext(ctx, "the artifact folder is a file; no artifacts uploaded", "artifacts", dir)
		return nil, nil
	default:
		return nil, fmt.Errorf("list artifacts %s: %w", dir, err)
	}

	prefix := dir + "/"
	if dir == "." {
		prefix = ""
	}
	var (
		outs  []output
		total int64
	)
	for i, f := range files {
		if len(outs) == maxArtifacts {
			a.log.WarnContext(ctx, "artifact count cap reached; the rest are not uploaded",
				"kept", maxArtifacts, "found", len(files), "first_left_out", f.Path, "left_out", len(files)-i)
			break
		}
		rel, ok := strings.CutPrefix(f.Path, prefix)
		name := "artifacts/" + rel
		if !ok || !artifactName(name) {
			a.log.WarnContext(ctx, "artifact name cannot be stored; not uploaded", "artifact", f.Path)
			continue
		}
		budget := min(maxArtifactBytes, maxArtifactTotal-total)
		if f.Size > budget {
			a.log.WarnContext(ctx, "artifact too large; not uploaded", "artifact", f.Path, "size_bytes", f.Size,
				"max_artifact_bytes", maxArtifactBytes, "max_total_bytes", maxArtifactTotal, "total_bytes", total)
			continue
		}
		// The budget bounds the read too, so a file that grew since it was listed cannot
		// push past the caps.
		data, err := sb.ReadFile(ctx, f.Path, budget)
		switch {
		case err == nil:
		case errors.Is(err, sandbox.ErrTooLarge), errors.Is(err, sandbox.ErrNotFound), errors.Is(err, sandbox.ErrPathEscape):
			a.log.WarnContext(ctx, "artifact changed while being collected; not uploaded", "artifact", f.Path, "error", err)
			continue
		default:
			return nil, fmt.Errorf("read artifact %s: %w", f.Path, err)
		}
		total += int64(len(data))
		outs = append(outs, output{name: name, data: data})
	}
	return outs, nil
}

// artifactName reports whether name can be a store key and a manifest subject: valid UTF-8
// without control characters or backslashes, a clean relative key, not too long, and no part
// the file store reserves.
func artifactName(name string) bool {
	if len(name) > maxArtifactName || !utf8.ValidString(name) || strings.ContainsRune(name, '\\') || !store.ValidKey(name) {
		return false
	}
	if strings.ContainsFunc(name, unicode.IsControl) {
		return false
	}
	for part := range strings.SplitSeq(name, "/") {
		if strings.HasPrefix(part, reservedPrefix) {
			return false
		}
	}
	return true
}
