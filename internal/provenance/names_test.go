package provenance

import "testing"

// TestNamesOneFileWhereNamesFold: Names.Add refuses a name that a file system folding case,
// Unicode normalization or trailing dots and spaces holds where a name taken before is (the
// same file, a file where a folder is, a folder where a file is), naming that one, and takes
// names such file systems keep apart.
func TestNamesOneFileWhereNamesFold(t *testing.T) {
	tests := []struct {
		name  string
		taken []string
		add   string
		clash string // "" when taken
	}{
		{"case", []string{"artifacts/Data.csv"}, "artifacts/data.csv", "artifacts/Data.csv"},
		{"case of a folder", []string{"artifacts/Out/a.csv"}, "artifacts/out/A.CSV", "artifacts/Out/a.csv"},
		{"Greek final sigma", []string{"artifacts/ΣΑΣ"}, "artifacts/σας", "artifacts/ΣΑΣ"},
		{"NFC and NFD", []string{"artifacts/re\u0301sume\u0301"}, "artifacts/résumé", "artifacts/re\u0301sume\u0301"},
		{"trailing dots and spaces", []string{"artifacts/notes"}, "artifacts/notes. .", "artifacts/notes"},
		{"a file where a folder is", []string{"artifacts/Out/a.csv"}, "artifacts/out", "artifacts/Out/a.csv"},
		{"a folder where a file is", []string{"artifacts/out"}, "artifacts/OUT/a.csv", "artifacts/out"},
		{"folders that fold equal, files apart", []string{"artifacts/Out/a.csv"}, "artifacts/out/b.csv", ""},
		{"accents are letters", []string{"artifacts/resume"}, "artifacts/résumé", ""},
		{"ß is not ss", []string{"artifacts/strasse"}, "artifacts/straße", ""},
		{"a dot inside", []string{"artifacts/a.b"}, "artifacts/ab", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var n Names
			for _, name := range tt.taken {
				if clash := n.Add(name); clash != "" {
					t.Fatalf("Add(%q) = %q, want it taken", name, clash)
				}
			}
			if got := n.Add(tt.add); got != tt.clash {
				t.Errorf("Add(%q) = %q, want %q", tt.add, got, tt.clash)
			}
		})
	}
}
