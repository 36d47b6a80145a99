package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestCheckedInSchemasAreCurrent: every schema in the repository is what schemagen writes
// from today's types and rules.
func TestCheckedInSchemasAreCurrent(t *testing.T) {
	root := filepath.Join("..", "..")
	files, err := generate(root)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is not what schemagen writes from the Go types; run  go generate ./cmd/schemagen  and commit the result", name)
		}
	}
}
