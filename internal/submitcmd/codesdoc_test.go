package submitcmd

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// codeRow is a row of docs/cli.md's table of error codes: | `code`[, `code`…] | exit | meaning |.
var codeRow = regexp.MustCompile("(?m)^\\| (`[a-z_]+`(?:, `[a-z_]+`)*) \\| ([0-9–]+) \\|")

// TestCLIDocListsEveryErrorCode holds docs/cli.md's table of the codes `--output json` errors
// carry to the codes submit gives (errorCodes, exitKinds, kindCodes and codeError), both ways,
// and each code that stands for one exit code (exitKinds) to its exit column.
func TestCLIDocListsEveryErrorCode(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	docExit := map[string]string{}
	for _, m := range codeRow.FindAllStringSubmatch(string(data), -1) {
		for c := range strings.SplitSeq(m[1], ", ") {
			docExit[strings.Trim(c, "`")] = m[2]
		}
	}
	code := map[string]bool{codeError: true}
	for _, row := range errorCodes {
		code[row.code] = true
	}
	for _, c := range kindCodes {
		code[c] = true
	}
	for exit, c := range exitKinds {
		code[c] = true
		if d, ok := docExit[c]; ok && !exitInColumn(exit, d) {
			t.Errorf("docs/cli.md gives %s the exit %s; submit exits %d with it", c, d, exit)
		}
	}
	for c := range code {
		if _, ok := docExit[c]; !ok {
			t.Errorf("docs/cli.md's table of error codes lacks %s, a code submit gives", c)
		}
	}
	for c := range docExit {
		if !code[c] {
			t.Errorf("docs/cli.md's table of error codes lists %s, which submit never gives", c)
		}
	}
	if len(docExit) < 15 {
		t.Errorf("read %d codes from docs/cli.md: the table was not found", len(docExit))
	}
}

// exitInColumn says whether exit is the column's number or within its range ("2–6").
func exitInColumn(exit int, column string) bool {
	lo, hi, isRange := strings.Cut(column, "–")
	if !isRange {
		hi = lo
	}
	a, err1 := strconv.Atoi(lo)
	b, err2 := strconv.Atoi(hi)
	return err1 == nil && err2 == nil && a <= exit && exit <= b
}
