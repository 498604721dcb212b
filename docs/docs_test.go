// Package docs holds the tests of the documentation as a whole; the docs
// that a package's code must match are tested beside that code (the
// limits table in internal/config, the permission block in cmd/delayd).
package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// placeholders are test names the docs use as examples, not as claims.
var placeholders = map[string]bool{"TestName": true}

// TestNamedTestsExist: every Test, Benchmark and Fuzz function the docs
// name (RELIABILITY.md's promise table, CONTRIBUTING's soaks, the
// benchmarks' commands) exists in a _test.go file of the repository, the
// client module included. A test deleted, renamed or moved to another
// name without its docs fails here, so a promise never points at a test
// that no longer holds it.
func TestNamedTestsExist(t *testing.T) {
	root := ".."
	have := map[string]bool{}
	fn := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz)[A-Z]\w*)\(`)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") && path != root) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range fn.FindAllStringSubmatch(string(b), -1) {
			have[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	docs, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, filepath.Join(root, "README.md"), filepath.Join(root, "CONTRIBUTING.md"))
	named := regexp.MustCompile(`\b(?:Test|Benchmark|Fuzz)[A-Z]\w*`)
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		var missing []string
		seen := map[string]bool{}
		for _, name := range named.FindAllString(string(b), -1) {
			if !have[name] && !placeholders[name] && !seen[name] {
				seen[name] = true
				missing = append(missing, name)
			}
		}
		sort.Strings(missing)
		if len(missing) > 0 {
			t.Errorf("%s names tests no _test.go file defines (deleted or renamed? update the doc): %s",
				filepath.Base(doc), strings.Join(missing, ", "))
		}
	}
}
