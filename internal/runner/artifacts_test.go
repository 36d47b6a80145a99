package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// memSandbox is a workdir of named sizes: ReadFile and Open return zeros of the size (Open's
// cost no memory at all), so the caps can be tested at their real values.
type memSandbox struct {
	sandbox.Sandbox // the methods collect does not use panic
	files           map[string]int64
	readErr         map[string]error // what ReadFile or Open of a name returns instead
	listErr         error
}

func (s *memSandbox) List(ctx context.Context, dir string) ([]sandbox.FileInfo, error) {
	var incomplete *sandbox.IncompleteError
	if s.listErr != nil && !errors.As(s.listErr, &incomplete) {
		return nil, s.listErr
	}
	var out []sandbox.FileInfo
	for name, size := range s.files {
		if strings.HasPrefix(name, dir+"/") {
			out = append(out, sandbox.FileInfo{Path: name, Size: size, Mode: 0o644})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, s.listErr
}

func (s *memSandbox) ReadFile(ctx context.Context, name string, maxBytes int64) ([]byte, error) {
	if err := s.readErr[name]; err != nil {
		return nil, err
	}
	size, ok := s.files[name]
	if !ok {
		return nil, fmt.Errorf("read %s: %w", name, sandbox.ErrNotFound)
	}
	if size > maxBytes {
		return nil, fmt.Errorf("read %s: %w", name, sandbox.ErrTooLarge)
	}
	return make([]byte, size), nil
}

func (s *memSandbox) Open(ctx context.Context, name string, maxBytes int64) (io.ReadCloser, error) {
	if err := s.readErr[name]; err != nil {
		return nil, err
	}
	size, ok := s.files[name]
	if !ok {
		return nil, fmt.Errorf("open %s: %w", name, sandbox.ErrNotFound)
	}
	if size > maxBytes {
		return nil, fmt.Errorf("open %s: %w", name, sandbox.ErrTooLarge)
	}
	return io.NopCloser(io.LimitReader(zeros{}, size)), nil
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func testAttempt(artifacts string) *attempt {
	return &attempt{profile: config.Profile{Report: "report.md", Artifacts: artifacts}, log: slog.New(slog.DiscardHandler)}
}

func names(outs []output) []string {
	var n []string
	for _, o := range outs {
		n = append(n, o.name)
	}
	return n
}

// withFile is files and one more.
func withFile(files map[string]int64, name string, size int64) map[string]int64 {
	files = maps.Clone(files)
	files[name] = size
	return files
}

func TestCollectArtifacts(t *testing.T) {
	t.Parallel()
	many := map[string]int64{}
	for i := range maxArtifacts + 6 {
		many[fmt.Sprintf("artifacts/f%03d.txt", i)] = 1
	}
	var firstMany []string
	for i := range maxArtifacts {
		firstMany = append(firstMany, fmt.Sprintf("artifacts/f%03d.txt", i))
	}
	boom := errors.New("exec: connection reset")
	longPath := "artifacts/z" + strings.Repeat("y", 4000) // sorts after every f<n>.txt

	tests := []struct {
		name      string
		artifacts string
		sb        *memSandbox
		want      []string
		skipped   []string // path:reason of what the manifest names as left out
	}{
		{
			name:      "nested files keep their path",
			artifacts: "artifacts",
			sb:        &memSandbox{files: map[string]int64{"artifacts/a.csv": 3, "artifacts/sub/b.txt": 0, "report.md": 5, "other/c": 1}},
			want:      []string{"artifacts/a.csv", "artifacts/sub/b.txt"},
		},
		{
			name:      "folder written unclean in the profile",
			artifacts: "./artifacts/",
			sb:        &memSandbox{files: map[string]int64{"artifacts/a.csv": 3}},
			want:      []string{"artifacts/a.csv"},
		},
		{
			name:      "no artifact folder",
			artifacts: "artifacts",
			sb:        &memSandbox{files: map[string]int64{"report.md": 5}, listErr: fmt.Errorf("list: %w", sandbox.ErrNotFound)},
		},
		{
			name:      "artifact folder is a link out of the workdir",
			artifacts: "artifacts",
			sb:        &memSandbox{listErr: fmt.Errorf("list: %w", sandbox.ErrPathEscape)},
			skipped:   []string{"artifacts:unreadable"},
		},
		{
			name:      "artifact folder is a file",
			artifacts: "artifacts",
			sb:        &memSandbox{files: map[string]int64{"artifacts": 10}, listErr: fmt.Errorf("sandbox: list artifacts: %w", sandbox.ErrNotDir)},
			skipped:   []string{"artifacts:unreadable"},
		},
		{
			name:      "listing fails",
			artifacts: "artifacts",
			sb:        &memSandbox{listErr: boom},
			skipped:   []string{"artifacts:unreadable"},
		},
		{
			name:      "folders that cannot be read",
			artifacts: "artifacts",
			sb: &memSandbox{files: map[string]int64{"artifacts/a": 1}, listErr: &sandbox.IncompleteError{Dir: "artifacts",
				Skipped: []sandbox.Skipped{{Path: "artifacts/deep/d/d", Reason: "nested past PATH_MAX"}}, More: 2}},
			want:    []string{"artifacts/a"},
			skipped: []string{"artifacts/deep/d/d:unreadable", "+2"},
		},
		{
			name:      "count cap",
			artifacts: "artifacts",
			sb:        &memSandbox{files: many},
			want:      firstMany,
			skipped: []string{"artifacts/f064.txt:count_cap", "artifacts/f065.txt:count_cap", "artifacts/f066.txt:count_cap",
				"artifacts/f067.txt:count_cap", "artifacts/f068.txt:count_cap", "artifacts/f069.txt:count_cap"},
		},
		{
			// The count cap names what it leaves out as every other reason does: cut, so that
			// paths of up to PATH_MAX cost the manifest little.
			name:      "count cap names a long path cut",
			artifacts: "artifacts",
			sb:        &memSandbox{files: withFile(many, longPath, 1)},
			want:      firstMany,
			skipped: []string{"artifacts/f064.txt:count_cap", "artifacts/f065.txt:count_cap", "artifacts/f066.txt:count_cap",
				"artifacts/f067.txt:count_cap", "artifacts/f068.txt:count_cap", "artifacts/f069.txt:count_cap",
				sandbox.ShortPath(longPath, maxNamedPath) + ":count_cap"},
		},
		{
			name:      "listing fails with an error naming a long path",
			artifacts: "artifacts",
			sb:        &memSandbox{listErr: fmt.Errorf("exec: %s: %w", longPath, boom)},
			skipped:   []string{"artifacts:unreadable"},
		},
		{
			name:      "size cap per file",
			artifacts: "artifacts",
			sb:        &memSandbox{files: map[string]int64{"artifacts/big": maxArtifactBytes + 1, "artifacts/edge": maxArtifactBytes, "artifacts/small": 1}},
			want:      []string{"artifacts/edge", "artifacts/small"},
			skipped:   []string{"artifacts/big:too_large"},
		},
		{
			name:      "size cap in total",
			artifacts: "artifacts",
			sb: &memSandbox{files: map[string]int64{
				"artifacts/1": maxArtifactBytes, "artifacts/2": maxArtifactBytes, "artifacts/3": maxArtifactBytes,
				"artifacts/4": maxArtifactBytes, "artifacts/5": maxArtifactBytes, "artifacts/6": 1, "artifacts/7": 0,
			}},
			want:    []string{"artifacts/1", "artifacts/2", "artifacts/3", "artifacts/4", "artifacts/7"},
			skipped: []string{"artifacts/5:too_large", "artifacts/6:too_large"},
		},
		{
			// A pod answers its listing from inside, where the job can forge it: a size below 0
			// would pass the size cap and lower the total, so that 4 GiB went through.
			name:      "a negative listed size",
			artifacts: "artifacts",
			sb: &memSandbox{files: map[string]int64{
				"artifacts/0-forged": -1 << 62, "artifacts/1": maxArtifactBytes, "artifacts/2": maxArtifactBytes,
				"artifacts/3": maxArtifactBytes, "artifacts/4": maxArtifactBytes, "artifacts/5": maxArtifactBytes,
			}},
			want:    []string{"artifacts/1", "artifacts/2", "artifacts/3", "artifacts/4"},
			skipped: []string{"artifacts/0-forged:unreadable", "artifacts/5:too_large"},
		},
		{
			name:      "names the store or the manifest cannot hold",
			artifacts: "artifacts",
			sb: &memSandbox{files: map[string]int64{
				`artifacts/back\slash`: 1, "artifacts/new\nline": 1, "artifacts/.boxcar-tmp-x": 1,
				"artifacts/bad\xffutf8": 1, "artifacts/" + strings.Repeat("n", maxArtifactName): 1, "artifacts/ok.txt": 1,
				// Format characters: an RTL override shows "rtl\u202etxt.exe" as "rtlexe.txt"; a
				// zero-width space makes two names look the same; a line separator breaks a line.
				"artifacts/rtl\u202etxt.exe": 1, "artifacts/zero\u200bwidth": 1, "artifacts/line\u2028sep": 1, "artifacts/bom\ufeff": 1,
				// Characters no S3 listing carries in XML (store.WritableKey): the object would
				// be listed as another key, or fail the listing.
				"artifacts/nonchar\ufffe": 1, "artifacts/nonchar\uffff": 1,
			}},
			want: []string{"artifacts/ok.txt"},
			skipped: []string{"artifacts/.boxcar-tmp-x:bad_name", "artifacts/back\\slash:bad_name", "artifacts/bad\xffutf8:bad_name",
				"artifacts/bom\ufeff:bad_name", "artifacts/line\u2028sep:bad_name", "artifacts/new\nline:bad_name",
				sandbox.ShortPath("artifacts/"+strings.Repeat("n", maxArtifactName), maxNamedPath) + ":bad_name",
				"artifacts/nonchar\ufffe:bad_name", "artifacts/nonchar\uffff:bad_name", "artifacts/rtl\u202etxt.exe:bad_name", "artifacts/zero\u200bwidth:bad_name"},
		},
		{
			// A client's file system that folds case or Unicode normalization (macOS, Windows)
			// would hold each pair as one file: the first in name order is taken, on every
			// worker alike, unless it is left out for another reason. All were taken on main.
			name:      "names that are one file where names fold",
			artifacts: "artifacts",
			sb: &memSandbox{files: map[string]int64{
				"artifacts/Data.csv": 1, "artifacts/data.csv": 1,
				"artifacts/re\u0301sume\u0301.csv": 1, "artifacts/résumé.csv": 1,
				"artifacts/Out/a.csv": 1, "artifacts/out": 1,
				"artifacts/Big": maxArtifactBytes + 1, "artifacts/big": 1,
			}},
			want:    []string{"artifacts/Data.csv", "artifacts/Out/a.csv", "artifacts/big", "artifacts/re\u0301sume\u0301.csv"},
			skipped: []string{"artifacts/Big:too_large", "artifacts/data.csv:bad_name", "artifacts/out:bad_name", "artifacts/résumé.csv:bad_name"},
		},
		{
			// Nothing is read while collecting: what cannot be read is left out at the upload
			// (TestUploadLeavesOutChangedArtifacts).
			name:      "files that will not read",
			artifacts: "artifacts",
			sb: &memSandbox{
				files:   map[string]int64{"artifacts/gone": 1, "artifacts/ok": 1},
				readErr: map[string]error{"artifacts/gone": boom},
			},
			want: []string{"artifacts/gone", "artifacts/ok"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := testAttempt(tt.artifacts)
			var c provenance.Collected
			outs, err := (&Runner{}).collectArtifacts(t.Context(), a, tt.sb, &c)
			if err != nil {
				t.Fatalf("err = %v; nothing the job left may fail the collection", err)
			}
			if got := names(outs); !slices.Equal(got, tt.want) {
				t.Errorf("artifacts = %q, want %q", got, tt.want)
			}
			var skipped []string
			for _, s := range c.Skipped {
				skipped = append(skipped, s.Path+":"+s.Reason)
			}
			if c.SkippedMore > 0 {
				skipped = append(skipped, fmt.Sprintf("+%d", c.SkippedMore))
			}
			if !slices.Equal(skipped, tt.skipped) {
				t.Errorf("left out = %q, want %q", skipped, tt.skipped)
			}
			for _, s := range c.Skipped {
				if len(s.Path) > maxNamedPath+len("…") || len(s.Detail) > maxSkipDetail+len("…") {
					t.Errorf("the manifest names a left-out file (%s) by %d bytes of path and %d of detail; want at most %d and %d",
						s.Reason, len(s.Path), len(s.Detail), maxNamedPath, maxSkipDetail)
				}
			}
			var total int64
			for _, o := range outs {
				rc, err := o.open(t.Context())
				if err != nil {
					continue
				}
				n, err := io.Copy(io.Discard, rc)
				rc.Close()
				if err != nil || n != o.size || o.path == "" {
					t.Errorf("%s: %d bytes of %d, err %v, workdir path %q", o.name, n, o.size, err, o.path)
				}
				total += n
			}
			if total > maxArtifactTotal {
				t.Errorf("collected %d bytes, more than the %d allowed", total, int64(maxArtifactTotal))
			}
		})
	}
}

// TestFinalMessageAsReportIsBounded: without a report file the model's final message is the
// report, bounded as a report file is: the agent accepts answers longer than maxReportBytes.
func TestFinalMessageAsReportIsBounded(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		final string
		want  func(body []byte) bool
	}{
		{name: "short", final: "done", want: func(b []byte) bool { return string(b) == "done" }},
		{name: "at the bound", final: strings.Repeat("a", maxReportBytes), want: func(b []byte) bool { return len(b) == maxReportBytes }},
		{name: "past the bound", final: strings.Repeat("a", 3*maxReportBytes), want: func(b []byte) bool {
			return len(b) <= maxReportBytes && strings.HasSuffix(string(b), fmt.Sprintf("final message is %d bytes; cut here at the report's bound of %d]\n", 3*maxReportBytes, maxReportBytes))
		}},
	}
	// Three-byte characters after 0, 1 and 2 bytes: one of them has the bound fall inside one.
	for pad := range 3 {
		tests = append(tests, struct {
			name  string
			final string
			want  func(body []byte) bool
		}{name: fmt.Sprintf("cut between characters, %d bytes ahead", pad), final: strings.Repeat("a", pad) + strings.Repeat("€", maxReportBytes/2),
			want: func(b []byte) bool { return len(b) <= maxReportBytes && utf8.Valid(b) }})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c provenance.Collected
			body, from, err := (&Runner{}).readReport(t.Context(), testAttempt("artifacts"), &memSandbox{}, tt.final, &c)
			if err != nil || from != fromFinalMessage || !tt.want(body) {
				t.Errorf("readReport of a %d-byte final message = %d bytes ending %q, %q, %v", len(tt.final), len(body), body[max(len(body)-120, 0):], from, err)
			}
		})
	}
}
