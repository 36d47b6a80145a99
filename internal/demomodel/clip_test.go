package demomodel

import (
	"strings"
	"testing"
)

// TestClipKeepsWholeCharacters: the demo model quotes a failed command's stderr cut to whole
// characters; it was cut at the bound, inside the character there.
func TestClipKeepsWholeCharacters(t *testing.T) {
	t.Parallel()
	if got, want := clip(strings.Repeat("e", 4)+"€€", 5), "eeee…"; got != want {
		t.Errorf("clip = %q, want %q", got, want)
	}
	if got := clip("short", 500); got != "short" {
		t.Errorf("clip of a short text = %q, want it whole", got)
	}
}
