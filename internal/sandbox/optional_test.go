package sandbox_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// wrapped is a wrapper as the pool's and the runner's are: Sandbox's methods, and Unwrap.
type wrapped struct{ sandbox.Sandbox }

func (w wrapped) Unwrap() sandbox.Sandbox { return w.Sandbox }

// ownEgress is a wrapper that has an optional interface of its own.
type ownEgress struct {
	wrapped
	sandbox.Egress
}

// TestAsFindsOptionalInterfacesThroughWrappers: each optional interface of a backend's sandbox
// is found through any number of wrappers; one a wrapper has itself is found before the one it
// wraps; a sandbox without it, wrapped or not, has none.
func TestAsFindsOptionalInterfacesThroughWrappers(t *testing.T) {
	t.Parallel()
	full := sandboxtest.Full{}
	for name, find := range sandboxtest.Optional {
		for depth, sb := range []sandbox.Sandbox{full, wrapped{full}, wrapped{wrapped{full}}} {
			if !find(sb) {
				t.Errorf("%s not found beneath %d wrappers", name, depth)
			}
		}
		if find(wrapped{}) || find(wrapped{wrapped{}}) {
			t.Errorf("%s found on a wrapper of nothing", name)
		}
	}
	own := ownEgress{wrapped: wrapped{full}, Egress: full}
	if eg, ok := sandbox.As[sandbox.Egress](own); !ok || eg != own {
		t.Errorf("As found %T for a wrapper that has Egress itself, want the wrapper", eg)
	}
	if _, ok := sandbox.As[sandboxtest.Full](wrapped{wrapped{full}}); !ok {
		t.Error("As did not find the backend's own type beneath two wrappers")
	}
}

// notOptional are the interfaces package sandbox declares that a sandbox does not have
// optionally: the contract itself, the wrapper's chain, and the Kubernetes backend's exec seam.
var notOptional = []string{"Provider", "Sandbox", "Wrapper", "PodExecutor"}

// TestOptionalInterfacesListed: every interface package sandbox declares is either one a
// sandbox may have (listed in sandboxtest.Optional, which the wrappers' tests check) or named
// in notOptional: a new optional interface fails here until it is listed.
func TestOptionalInterfacesListed(t *testing.T) {
	t.Parallel()
	declared := sandboxInterfaces(t)
	for _, name := range slices.Sorted(maps.Keys(declared)) {
		if _, ok := sandboxtest.Optional[name]; !ok && !slices.Contains(notOptional, name) {
			t.Errorf("sandbox.%s is not in sandboxtest.Optional: list it there (and give sandboxtest.Full its methods), or in notOptional if no sandbox has it", name)
		}
	}
	for name := range sandboxtest.Optional {
		if _, ok := declared[name]; !ok {
			t.Errorf("sandboxtest.Optional lists %s, which package sandbox does not declare", name)
		}
	}
}

// TestOptionalInterfacesFoundWithAs: no code outside As asks a sandbox for an optional
// interface with a type assertion, which misses it on a wrapped sandbox (a warm pool's lost
// the manifest's usage that way). Assertions to a named optional interface and to an
// anonymous interface with one of their methods are caught.
func TestOptionalInterfacesFoundWithAs(t *testing.T) {
	t.Parallel()
	declared := sandboxInterfaces(t)
	methods := map[string]bool{}
	for name := range sandboxtest.Optional {
		for _, m := range declared[name].Methods.List {
			for _, n := range m.Names {
				methods[n.Name] = true
			}
		}
	}
	for _, root := range []string{"../../internal", "../../cmd"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				if ta, ok := n.(*ast.TypeAssertExpr); ok && assertsOptional(ta.Type, methods) {
					t.Errorf("%s: a type assertion to %s: use sandbox.As, which finds it beneath wrappers", path, types(ta.Type))
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// assertsOptional reports whether a type assertion's type is one of sandbox's optional
// interfaces (sandbox.X outside the package, X inside) or an interface with one of their
// methods.
func assertsOptional(typ ast.Expr, methods map[string]bool) bool {
	switch x := typ.(type) {
	case *ast.SelectorExpr:
		if pkg, ok := x.X.(*ast.Ident); ok && pkg.Name == "sandbox" {
			_, listed := sandboxtest.Optional[x.Sel.Name]
			return listed
		}
	case *ast.Ident:
		_, listed := sandboxtest.Optional[x.Name]
		return listed
	case *ast.InterfaceType:
		for _, m := range x.Methods.List {
			for _, n := range m.Names {
				if methods[n.Name] {
					return true
				}
			}
		}
	}
	return false
}

func types(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.SelectorExpr:
		return types(x.X) + "." + x.Sel.Name
	case *ast.Ident:
		return x.Name
	}
	return "an interface"
}

// sandboxInterfaces parses package sandbox's own files for the interfaces it declares.
func sandboxInterfaces(t *testing.T) map[string]*ast.InterfaceType {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*ast.InterfaceType{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok && ts.Name.IsExported() {
				if it, ok := ts.Type.(*ast.InterfaceType); ok {
					out[ts.Name.Name] = it
				}
			}
			return true
		})
	}
	return out
}
