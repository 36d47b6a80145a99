package runner

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
)

// Bounds on what a job can leave behind.
const (
	maxReportBytes   = 4 << 20
	maxArtifacts     = 64
	maxArtifactBytes = 64 << 20
	maxArtifactTotal = 256 << 20
)

// output is one file the run leaves in the store, named relative to runs/<id>/.
type output struct {
	name string
	data []byte
}

func (o output) digest() string {
	sum := sha256.Sum256(o.data)
	return hex.EncodeToString(sum[:])
}

// commit uploads the run: artifacts, transcript and report first, then the manifest with a
// create-only put. The manifest is the commit marker: once it exists the run is final, and a
// stale attempt that comes second gets store.ErrExists.
func (r *Runner) commit(ctx context.Context, a *attempt, sb sandbox.Sandbox, state job.State, runErr error) error {
	outs, err := r.collect(ctx, a, sb)
	if err != nil {
		return err
	}
	outs = append(outs, output{name: "transcript.jsonl", data: a.result.Transcript})
	for _, o := range outs {
		if err := r.cfg.Store.Put(ctx, store.RunPrefix(a.job.ID)+o.name, bytes.NewReader(o.data), int64(len(o.data))); err != nil {
			return fmt.Errorf("upload %s: %w", o.name, err)
		}
		r.m.UploadedBytes.Add(float64(len(o.data)))
	}
	manifest, err := r.manifest(a, outs, state, runErr)
	if err != nil {
		return err
	}
	if err := r.cfg.Store.PutIfAbsent(ctx, store.ManifestKey(a.job.ID), bytes.NewReader(manifest), int64(len(manifest))); err != nil {
		return err
	}
	if r.cfg.SigningKey != nil {
		env, err := signManifest(ctx, manifest, r.cfg.SigningKey)
		if err != nil {
			return fmt.Errorf("sign manifest: %w", err)
		}
		if err := r.cfg.Store.Put(ctx, store.SignatureKey(a.job.ID), bytes.NewReader(env), int64(len(env))); err != nil {
			return fmt.Errorf("upload manifest signature: %w", err)
		}
	}
	return nil
}

// collect reads the report and the artifacts out of the sandbox. Without a report file, the
// model's final answer is the report.
func (r *Runner) collect(ctx context.Context, a *attempt, sb sandbox.Sandbox) ([]output, error) {
	var outs []output
	report, err := sb.ReadFile(ctx, a.profile.Report, maxReportBytes)
	switch {
	case err == nil:
	case errors.Is(err, sandbox.ErrNotFound):
		report = []byte(a.result.FinalMessage)
	default:
		return nil, fmt.Errorf("read report %s: %w", a.profile.Report, err)
	}
	outs = append(outs, output{name: "report.md", data: report})

	files, err := sb.List(ctx, a.profile.Artifacts)
	if err != nil && !errors.Is(err, sandbox.ErrNotFound) {
		return nil, fmt.Errorf("list artifacts: %w", err)
	}
	var total int64
	for i, f := range files {
		if i == maxArtifacts {
			a.log.WarnContext(ctx, "artifact count cap reached; the rest are not uploaded", "kept", maxArtifacts, "found", len(files))
			break
		}
		if f.Size > maxArtifactBytes || total+f.Size > maxArtifactTotal {
			a.log.WarnContext(ctx, "artifact too large; not uploaded", "artifact", f.Path, "size", f.Size)
			continue
		}
		data, err := sb.ReadFile(ctx, f.Path, maxArtifactBytes)
		if err != nil {
			return nil, fmt.Errorf("read artifact %s: %w", f.Path, err)
		}
		total += int64(len(data))
		rel := strings.TrimPrefix(f.Path, strings.TrimSuffix(a.profile.Artifacts, "/")+"/")
		outs = append(outs, output{name: "artifacts/" + rel, data: data})
	}
	return outs, nil
}
