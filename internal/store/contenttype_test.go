package store_test

import (
	"testing"

	"github.com/boxcar-run/boxcar/internal/store"
)

func TestContentType(t *testing.T) {
	const id = "20261202t101500-abcdef012345"
	attempt := store.AttemptPrefix(id, "1-0a1b2c3d")
	tests := []struct{ key, want string }{
		{attempt + "report.md", "text/markdown; charset=utf-8"},
		{attempt + "transcript.jsonl", "application/x-ndjson"},
		{store.ManifestKey(id), "application/json"},
		{store.SignatureKey(id), "application/json"},
		{store.AttemptSignatureKey(id, "1-0a1b2c3d"), "application/json"},
		{store.RunPrefix(id) + "manifest.sigstore.json", "application/json"},
		{store.InputKey("00ff"), "application/octet-stream"},
		{attempt + "artifacts/table.csv", "text/csv; charset=utf-8"},
		{attempt + "artifacts/TABLE.CSV", "text/csv; charset=utf-8"},
		{attempt + "artifacts/notes/summary.txt", "text/plain; charset=utf-8"},
		{attempt + "artifacts/chart.png", "image/png"},
		{attempt + "artifacts/paper.pdf", "application/pdf"},
		{attempt + "artifacts/data.json", "application/json"},
		{attempt + "artifacts/notes.md", "text/markdown; charset=utf-8"},
		{attempt + "artifacts/config.yaml", "application/yaml"},
		// What a browser would run or render as a page is shown as text.
		{attempt + "artifacts/page.html", "text/plain; charset=utf-8"},
		{attempt + "artifacts/page.HTM", "text/plain; charset=utf-8"},
		{attempt + "artifacts/logo.svg", "text/plain; charset=utf-8"},
		{attempt + "artifacts/app.js", "text/plain; charset=utf-8"},
		{attempt + "artifacts/feed.xml", "text/plain; charset=utf-8"},
		// No extension, an unknown one, a dot file.
		{attempt + "artifacts/Makefile", "application/octet-stream"},
		{attempt + "artifacts/blob.zz-unknown", "application/octet-stream"},
		{attempt + "artifacts/.hidden", "application/octet-stream"},
	}
	for _, tt := range tests {
		if got := store.ContentType(tt.key); got != tt.want {
			t.Errorf("ContentType(%s) = %q, want %q", tt.key, got, tt.want)
		}
	}
}
