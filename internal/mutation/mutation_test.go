package mutation

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// root is the module root: tests run in their package's directory.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", dir, err)
	}
	return dir
}

// mutate returns File's text with the mutation applied, or why it cannot
// be: a snippet that does not occur exactly once is stale.
func (m mutation) mutate(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, m.File))
	if err != nil {
		return "", err
	}
	src := string(b)
	if n := strings.Count(src, m.Old); n != 1 {
		return "", fmt.Errorf("mutation %s: %q occurs %d times in %s, want exactly once: update the table", m.Name, m.Old, n, m.File)
	}
	return strings.Replace(src, m.Old, m.New, 1), nil
}

// TestSnippetsCurrent keeps the table in step with the code and the
// daemon suite (fast; runs in the ordinary suite).
func TestSnippetsCurrent(t *testing.T) {
	dir := root(t)
	sys, err := filepath.Glob(filepath.Join(dir, "internal/daemon/systest/*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	var suite strings.Builder
	for _, f := range sys {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		suite.Write(b)
	}
	names := map[string]bool{}
	for _, m := range mutations {
		if names[m.Name] {
			t.Errorf("mutation name %s used twice", m.Name)
		}
		names[m.Name] = true
		if _, err := m.mutate(dir); err != nil {
			t.Error(err)
		}
		// A daemon test renamed or deleted would leave its row quietly
		// running nothing.
		for _, name := range strings.Split(m.Sys, "|") {
			if name != "" && !strings.Contains(suite.String(), "func "+name+"(") {
				t.Errorf("mutation %s: no daemon test %s in internal/daemon/systest", m.Name, name)
			}
		}
		// Any package's code, never a test: its mutated package's tests
		// run first, so a mutated test would only test itself. A Lua
		// script counts as code of the package that embeds it.
		switch {
		case strings.HasSuffix(m.File, ".lua"):
			src, err := m.mutate(dir)
			if err == nil {
				_, _, err = embedding(dir, m.File, src)
			}
			if err != nil {
				t.Error(err)
			}
		case !strings.HasSuffix(m.File, ".go") || strings.HasSuffix(m.File, "_test.go"):
			t.Errorf("mutation %s: %s is not a Go file of the code", m.Name, m.File)
		}
	}
}

// embedding returns the Go file, in the parent directory of a Lua script
// (internal/store for internal/store/lua/claim.lua), that embeds it with
// //go:embed, and that file's text with the variable set to src instead:
// go test's -overlay replaces Go files, not the files they embed.
func embedding(dir, file, src string) (goFile, goSrc string, err error) {
	pkg := filepath.Dir(filepath.Dir(file))
	directive := "//go:embed " + filepath.Base(filepath.Dir(file)) + "/" + filepath.Base(file) + "\n"
	gos, err := filepath.Glob(filepath.Join(dir, pkg, "*.go"))
	if err != nil {
		return "", "", err
	}
	for _, f := range gos {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", "", err
		}
		before, after, ok := strings.Cut(string(b), directive)
		if !ok || strings.HasSuffix(f, "_test.go") {
			continue
		}
		decl, rest, _ := strings.Cut(after, "\n")
		name, isVar := strings.CutPrefix(decl, "var ")
		name, isString := strings.CutSuffix(name, " string")
		if !isVar || !isString || strings.Contains(name, " ") {
			return "", "", fmt.Errorf("%s: %q after %q is not `var NAME string`", f, decl, strings.TrimSpace(directive))
		}
		return f, before + "var " + name + " = " + strconv.Quote(src) + "\n" + rest, nil
	}
	return "", "", fmt.Errorf("no Go file in %s embeds %s", pkg, file)
}

var failRE = regexp.MustCompile(`(?m)^\s*--- FAIL: (\S+)`)
var timeoutRE = regexp.MustCompile(`(?m)^\s+(Test\S+) \(\d`) // the running tests a timeout panic lists

// run runs go test with the overlay and reports whether the tests passed,
// and if not, the failing tests. A build failure is the table's fault,
// not a catch: it is returned as an error.
func run(t *testing.T, dir, overlay, pkg, runRE string, timeout time.Duration) (passed bool, caught []string, err error) {
	t.Helper()
	args := []string{"test", "-count=1", "-overlay", overlay, "-timeout", timeout.String()}
	if runRE != "" {
		args = append(args, "-run", runRE)
	}
	args = append(args, pkg)
	ctx, cancel := context.WithTimeout(context.Background(), timeout+2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	out, runErr := cmd.CombinedOutput()
	if runErr == nil {
		return true, nil, nil
	}
	s := string(out)
	if strings.Contains(s, "[build failed]") || strings.Contains(s, "[setup failed]") {
		return false, nil, fmt.Errorf("%s does not build:\n%s", pkg, s)
	}
	seen := map[string]bool{}
	for _, m := range failRE.FindAllStringSubmatch(s, -1) {
		top, _, _ := strings.Cut(m[1], "/")
		if !seen[top] {
			seen[top] = true
			caught = append(caught, top)
		}
	}
	if strings.Contains(s, "panic: test timed out") {
		for _, m := range timeoutRE.FindAllStringSubmatch(s, -1) {
			top, _, _ := strings.Cut(m[1], "/")
			if !seen[top] {
				seen[top] = true
				caught = append(caught, top+" (timed out)")
			}
		}
	}
	if len(caught) == 0 {
		caught = []string{"(package failed: " + lastLine(s) + ")"}
	}
	return false, caught, nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// TestMutations applies each mutation in turn and runs the mutated
// package's tests, then, for a survivor, the daemon suite's tests of its
// Sys regex. DELAYD_MUTATION=1 turns it on; DELAYD_MUTATION_ONLY (a
// regex of names) picks mutations; DELAYD_MUTATION_OUT names a file for
// the Markdown table of results.
func TestMutations(t *testing.T) {
	if os.Getenv("DELAYD_MUTATION") != "1" {
		t.Skip("slow: set DELAYD_MUTATION=1 to run the mutation check")
	}
	var only *regexp.Regexp
	if s := os.Getenv("DELAYD_MUTATION_ONLY"); s != "" {
		only = regexp.MustCompile(s)
	}
	dir := root(t)
	tmp := t.TempDir()
	var rows []string
	survived := 0
	for i, m := range mutations {
		if only != nil && !only.MatchString(m.Name) {
			continue
		}
		src, err := m.mutate(dir)
		if err != nil {
			t.Fatal(err)
		}
		// The file replaced: the mutated one, or for a Lua script the Go
		// file that embeds it.
		file := filepath.Join(dir, m.File)
		if strings.HasSuffix(m.File, ".lua") {
			if file, src, err = embedding(dir, m.File, src); err != nil {
				t.Fatal(err)
			}
		}
		mutated := filepath.Join(tmp, fmt.Sprintf("%02d-%s", i, filepath.Base(file)))
		if err := os.WriteFile(mutated, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		ov, _ := json.Marshal(map[string]map[string]string{"Replace": {file: mutated}})
		overlay := filepath.Join(tmp, fmt.Sprintf("%02d.json", i))
		if err := os.WriteFile(overlay, ov, 0o600); err != nil {
			t.Fatal(err)
		}
		pkg, err := filepath.Rel(dir, filepath.Dir(file))
		if err != nil {
			t.Fatal(err)
		}
		pkg = "./" + pkg
		start := time.Now()
		passed, caught, err := run(t, dir, overlay, pkg, "", 5*time.Minute)
		if err != nil {
			t.Fatalf("mutation %s: %v", m.Name, err)
		}
		by := ""
		switch {
		case !passed:
			by = pkg + ": " + strings.Join(caught, ", ")
		case m.Sys != "":
			passed, caught, err = run(t, dir, overlay, "./internal/daemon/systest", m.Sys, 10*time.Minute)
			if err != nil {
				t.Fatalf("mutation %s: %v", m.Name, err)
			}
			if !passed {
				by = "systest: " + strings.Join(caught, ", ")
			}
		}
		result := "caught by " + by
		if by == "" {
			result = "SURVIVED"
			survived++
		}
		t.Logf("%-32s %s (%s)", m.Name, result, time.Since(start).Round(time.Second))
		if by == "" {
			by = "**survived**"
		}
		rows = append(rows, fmt.Sprintf("| %s | `%s` | %s | %s |", m.Name, m.File, m.Promise, by))
	}
	table := "| mutation | file | promise broken | caught by |\n|---|---|---|---|\n" + strings.Join(rows, "\n") + "\n"
	if out := os.Getenv("DELAYD_MUTATION_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(table), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if survived > 0 {
		t.Errorf("%d of %d mutations survived:\n%s", survived, len(rows), table)
	}
}
