package spare

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestEncodeDecode(t *testing.T) {
	tests := []struct {
		name      string
		argv, env []string
		dir       string
	}{
		{"plain", []string{"sh", "-c", "echo hi"}, []string{"PATH=/bin", "HOME=/work"}, "/work"},
		{"empty strings", []string{"printf", ""}, nil, "/work/sub dir"},
		{"newlines and equals", []string{"x\ny", "a=b"}, []string{"V=1=2\n3"}, "/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			argv, env, dir, stdin, err := decode(Encode(tt.argv, tt.env, tt.dir, tt.name == "plain"))
			if err != nil || !slices.Equal(argv, tt.argv) || !slices.Equal(env, tt.env) || dir != tt.dir || stdin != (tt.name == "plain") {
				t.Errorf("decode = %q %q %q %v; want %q %q %q", argv, env, dir, err, tt.argv, tt.env, tt.dir)
			}
		})
	}
	for _, bad := range []string{"", "x\x00", "0\x000\x00/\x00", "5\x00a\x00"} {
		if _, _, _, _, err := decode([]byte(bad)); err == nil {
			t.Errorf("decode(%q) succeeded", bad)
		}
	}
}

// TestImportsStayLight: the helper runs from its package's init, which Go runs once the
// package's imports (those of every file) have initialised; an import of fmt, bytes or strings
// would put unicode's tables and reflect, and with them most of the binary's packages, before it.
func TestImportsStayLight(t *testing.T) {
	light := []string{"errors", "io", "os", "strconv", "syscall"}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if path := strings.Trim(imp.Path.Value, `"`); !slices.Contains(light, path) {
				t.Errorf("%s imports %s; the helper may import only %v", name, path, light)
			}
		}
	}
}
