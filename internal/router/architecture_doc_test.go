package router

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docs/architecture.md names the packages a request goes through and where new things go; the
// names must stay true as the code moves. Every path it names (internal/..., cmd/..., a package
// or a file) exists, and every pkg.Name or pkg.Type.Method it names in code quotes is declared
// in that package.
func TestArchitectureNamesOnlyPackagesThatExist(t *testing.T) {
	root := filepath.Join("..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	paths := regexp.MustCompile(`\b(?:internal|cmd)/[a-z0-9_/]*[a-z0-9_](?:\.go)?\b`).FindAllString(string(doc), -1)
	if len(paths) < 20 {
		t.Fatalf("docs/architecture.md names %d paths; the page lists the packages", len(paths))
	}
	for _, p := range paths {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("docs/architecture.md names %s, which does not exist", p)
		}
	}

	names := regexp.MustCompile("`([a-z]+)\\.([A-Z]\\w*)(?:\\.([A-Z]\\w*))?`").FindAllStringSubmatch(string(doc), -1)
	if len(names) == 0 {
		t.Fatal("docs/architecture.md names no code in quotes")
	}
	for _, n := range names {
		decls := declared(t, filepath.Join(root, "internal", n[1]))
		want := n[2]
		if n[3] != "" {
			want = n[2] + "." + n[3]
		}
		if !decls[want] {
			t.Errorf("docs/architecture.md names %s, which package internal/%s does not declare", n[0], n[1])
		}
	}
}

// declared returns the names a package's non-test files declare at top level, its methods as
// Type.Method.
func declared(t *testing.T, dir string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no package in %s", dir)
	}
	names := map[string]bool{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				name := d.Name.Name
				if d.Recv != nil && len(d.Recv.List) == 1 {
					recv := d.Recv.List[0].Type
					if star, ok := recv.(*ast.StarExpr); ok {
						recv = star.X
					}
					if id, ok := recv.(*ast.Ident); ok {
						name = id.Name + "." + name
					}
				}
				names[name] = true
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						names[s.Name.Name] = true
					case *ast.ValueSpec:
						for _, id := range s.Names {
							names[id.Name] = true
						}
					}
				}
			}
		}
	}
	return names
}
