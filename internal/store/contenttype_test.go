package store_test

import (
	"testing"

	"github.com/boxcar-run/boxcar/internal/store"
)

func TestContentType(t *testing.T) {
	const id = "20261202t101500-abcdef012345"
	tests := []struct{ key, want string }{
		{store.ReportKey(id), "text/markdown; charset=utf-8"},
		{store.TranscriptKey(id), "application/x-ndjson"},
		{store.ManifestKey(id), "application/json"},
		{store.SignatureKey(id), "application/json"},
		{store.RunPrefix(id) + "manifest.sigstore.json", "application/json"},
		{store.InputKey("00ff"), "application/octet-stream"},
		{store.ArtifactKey(id, "table.csv"), "text/csv; charset=utf-8"},
		{store.ArtifactKey(id, "TABLE.CSV"), "text/csv; charset=utf-8"},
		{store.ArtifactKey(id, "notes/summary.txt"), "text/plain; charset=utf-8"},
		{store.ArtifactKey(id, "chart.png"), "image/png"},
		{store.ArtifactKey(id, "paper.pdf"), "application/pdf"},
		{store.ArtifactKey(id, "data.json"), "application/json"},
		{store.ArtifactKey(id, "notes.md"), "text/markdown; charset=utf-8"},
		{store.ArtifactKey(id, "config.yaml"), "application/yaml"},
		// What a browser would run or render as a page is shown as text.
		{store.ArtifactKey(id, "page.html"), "text/plain; charset=utf-8"},
		{store.ArtifactKey(id, "page.HTM"), "text/plain; charset=utf-8"},
		{store.ArtifactKey(id, "logo.svg"), "text/plain; charset=utf-8"},
		{store.ArtifactKey(id, "app.js"), "text/plain; charset=utf-8"},
		{store.ArtifactKey(id, "feed.xml"), "text/plain; charset=utf-8"},
		// No extension, an unknown one, a dot file.
		{store.ArtifactKey(id, "Makefile"), "application/octet-stream"},
		{store.ArtifactKey(id, "blob.zz-unknown"), "application/octet-stream"},
		{store.ArtifactKey(id, ".hidden"), "application/octet-stream"},
	}
	for _, tt := range tests {
		if got := store.ContentType(tt.key); got != tt.want {
			t.Errorf("ContentType(%s) = %q, want %q", tt.key, got, tt.want)
		}
	}
}
