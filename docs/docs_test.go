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
	"strconv"
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

// TestFixedSleepsCounted: CONTRIBUTING.md's count of the fixed sleeps in
// code only tests use is the count in the code. A test waits on events;
// each fixed sleep is the point of its test and named in that list, so a
// new one changes the count here and its entry there together.
func TestFixedSleepsCounted(t *testing.T) {
	root := ".."
	testOnly := regexp.MustCompile(`^internal/(testutil|daemon/daemontest|clienttest|mutation)/`)
	n := 0
	var where []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") && path != root) {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() || !strings.HasSuffix(rel, ".go") || !strings.HasSuffix(rel, "_test.go") && !testOnly.MatchString(rel) {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if k := strings.Count(string(b), "time."+"Sleep("); k > 0 { // split: this file is counted too
			n += k
			where = append(where, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "CONTRIBUTING.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("```\n\n(\\d+) of them \\(").FindSubmatch(b)
	if m == nil {
		t.Fatal("CONTRIBUTING.md gives no count of the fixed sleeps (\"N of them (\" after the command that counts them)")
	}
	if string(m[1]) != strconv.Itoa(n) {
		t.Errorf("%d fixed sleeps in code only tests use, CONTRIBUTING.md says %s: wait for an event with testutil.Eventually, "+
			"or name the sleep in CONTRIBUTING's list and update its count (files: %s)", n, m[1], strings.Join(where, " "))
	}
}
