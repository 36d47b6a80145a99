package provenance

import (
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// FoldedName is what name becomes on a file system that takes names apart from the bytes: one
// that ignores case (macOS and Windows by default), one that ignores Unicode normalization
// (macOS: "é" as one code point, NFC, and as "e" and a combining accent, NFD, name one file),
// and Windows, which drops a name's trailing dots and spaces. Two of a run's names with one
// FoldedName are one file there: written one after the other, the second replaces the first
// without a word. Case is folded one rune at a time (Unicode's simple folding, as NTFS and
// APFS fold), each rune to the least of those it folds with.
func FoldedName(name string) string {
	parts := strings.Split(norm.NFD.String(name), "/")
	for i, p := range parts {
		parts[i] = strings.Map(foldRune, strings.TrimRight(p, ". "))
	}
	return norm.NFD.String(strings.Join(parts, "/"))
}

func foldRune(r rune) rune {
	least := r
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		least = min(least, f)
	}
	return least
}

// Names are the files of one run as a file system that folds names would hold them: what
// Add has taken, by FoldedName, and the folders they are in.
type Names struct {
	files   map[string]string // folded name: the name taken
	folders map[string]string // folded folder: the first name in it
}

// Add takes name, a slash-separated path, unless a file system that folds names would have it
// and a name taken before in one place: the same file, a file where the other has a folder, or
// a folder where the other is a file. It returns "" when it took name, else that other name.
// Names taken in one order give the same answers on every machine, whatever its file system.
func (n *Names) Add(name string) (clash string) {
	if n.files == nil {
		n.files, n.folders = map[string]string{}, map[string]string{}
	}
	folded := FoldedName(name)
	if other, ok := n.files[folded]; ok {
		return other
	}
	if other, ok := n.folders[folded]; ok {
		return other
	}
	for i := range len(folded) {
		if folded[i] != '/' {
			continue
		}
		if other, ok := n.files[folded[:i]]; ok {
			return other
		}
	}
	n.files[folded] = name
	for i := range len(folded) {
		if folded[i] == '/' && n.folders[folded[:i]] == "" {
			n.folders[folded[:i]] = name
		}
	}
	return ""
}
