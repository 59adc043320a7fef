package tally_test

import (
	"errors"
	"go/build"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/tally-ledger/tally"

// layers are the module's packages from the bottom up, as docs/design.md §1
// draws them. A package's code imports only packages of lower layers; the
// program (cmd/tally and everything under it) sits on top and may import
// anything. A new package gets a place here, where its imports put it.
var layers = [][]string{
	// Foundations: shapes and machinery, no domain package below them.
	{"validation", "amount", "migrations", "internal/ids", "internal/faultproxy", "internal/ratelimit", "internal/locks", "internal/notify", "internal/pause", "internal/ttlcache", "internal/pguuid", "internal/pgcopy", "internal/pgnamed", "internal/pgcpu",
		"internal/testrun", "internal/kafkatest"},
	{"periods", "ingest/wire", "internal/pgtest"},
	{"ledger", "producer", "tokens", "pools"},
	{"quota", "ingest", "internal/ledgertest"},
	{"admission", "admit", "alerts"},
	{"reconcile"},
	{"api"},
	{"console"},
}

// program is the top: the binary and what only it uses.
const program = "cmd/tally"

// testHelpers are the internal packages only tests import.
var testHelpers = []string{"internal/pgtest", "internal/kafkatest", "internal/ledgertest", "internal/testrun"}

type pkg struct {
	path                   string // relative to the module
	imports, testImports   []string
	importedOutsideProgram bool
}

// TestLayers fails when an import points upward: a domain or foundation
// package (or its tests) importing the program, a package importing one of
// its own layer or above, code outside tests importing a test helper, or a
// package in internal/ that only the program uses (it belongs under
// cmd/tally/internal/).
func TestLayers(t *testing.T) {
	pkgs := readPackages(t)
	layer := map[string]int{}
	for i, l := range layers {
		for _, p := range l {
			layer[p] = i
		}
	}
	inProgram := func(p string) bool { return p == program || strings.HasPrefix(p, program+"/") }
	for _, p := range pkgs {
		if p.path == "." || inProgram(p.path) {
			continue
		}
		if _, ok := layer[p.path]; !ok {
			t.Errorf("%s has no layer: give it one in layers (and in docs/design.md §1)", p.path)
		}
	}
	for _, p := range pkgs {
		_, placed := layer[p.path]
		for _, imp := range p.imports {
			_, impPlaced := layer[imp]
			switch {
			case inProgram(p.path):
			case inProgram(imp):
				t.Errorf("%s imports %s: only the program imports the program", p.path, imp)
			case placed && impPlaced && layer[imp] >= layer[p.path]:
				t.Errorf("%s (layer %d) imports %s (layer %d): imports point down", p.path, layer[p.path], imp, layer[imp])
			}
			if slices.Contains(testHelpers, imp) {
				t.Errorf("%s imports the test helper %s outside its tests", p.path, imp)
			}
		}
		for _, imp := range p.testImports {
			if !inProgram(p.path) && inProgram(imp) {
				t.Errorf("a test of %s imports %s: only the program imports the program", p.path, imp)
			}
		}
	}
	for _, p := range pkgs {
		if strings.HasPrefix(p.path, "internal/") && !p.importedOutsideProgram {
			t.Errorf("%s is imported by the program only: it belongs under %s/internal/", p.path, program)
		}
	}
}

// readPackages parses every package of the module (its imports only).
func readPackages(t *testing.T) []*pkg {
	t.Helper()
	byPath := map[string]*pkg{}
	var all []*pkg
	err := filepath.WalkDir(".", func(dir string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if name := d.Name(); dir != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
			return filepath.SkipDir
		}
		bp, err := build.ImportDir(dir, 0)
		var noGo *build.NoGoError
		if errors.As(err, &noGo) {
			return nil
		}
		if err != nil {
			return err
		}
		p := &pkg{path: filepath.ToSlash(dir), imports: own(bp.Imports), testImports: own(append(bp.TestImports, bp.XTestImports...))}
		byPath[p.path] = p
		all = append(all, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range all {
		if p.path == program || strings.HasPrefix(p.path, program+"/") {
			continue
		}
		for _, imp := range append(p.imports, p.testImports...) {
			if q := byPath[imp]; q != nil && q != p {
				q.importedOutsideProgram = true
			}
		}
	}
	if len(all) < 10 {
		t.Fatalf("read %d packages: run from the module's root", len(all))
	}
	return all
}

// own keeps the module's imports, relative to the module.
func own(imports []string) []string {
	var out []string
	for _, imp := range imports {
		if rel, ok := strings.CutPrefix(imp, module+"/"); ok {
			out = append(out, rel)
		}
	}
	return out
}
