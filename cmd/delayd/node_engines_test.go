package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// nodeMajor is the oldest Node major in an engines range such as ">=18",
// ">= 22.x" or ">=18.0.0"; ok is false for a range it does not read.
func nodeMajor(rng string) (major int, ok bool) {
	m := regexp.MustCompile(`^>=\s*(\d+)(\.[\dx]+)*$`).FindStringSubmatch(strings.TrimSpace(rng))
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[1])
	return n, err == nil
}

// TestNodeExampleEngines: examples/node promises one Node version in its
// package.json, its lockfile and the docs, and every locked package runs
// on it. Node 18 is what Debian 12's nodejs package, which ./test.sh
// installs, gives.
func TestNodeExampleEngines(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(examplesDir, "node")
	type pkg struct {
		Engines struct {
			Node string `json:"node"`
		} `json:"engines"`
	}
	var manifest pkg
	var lock struct {
		Packages map[string]pkg `json:"packages"`
	}
	for name, v := range map[string]any{"package.json": &manifest, "package-lock.json": &lock} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	want, ok := nodeMajor(manifest.Engines.Node)
	if !ok {
		t.Fatalf("package.json engines.node %q: want >=N", manifest.Engines.Node)
	}
	if want != 18 {
		t.Errorf("package.json asks Node %d, want 18 (Debian 12's, which ./test.sh installs)", want)
	}
	if root := lock.Packages[""].Engines.Node; root != manifest.Engines.Node {
		t.Errorf("package-lock.json says engines.node %q, package.json %q: run npm install --package-lock-only", root, manifest.Engines.Node)
	}
	for name, p := range lock.Packages {
		if name == "" || p.Engines.Node == "" {
			continue
		}
		if n, ok := nodeMajor(p.Engines.Node); !ok || n > want {
			t.Errorf("%s needs Node %q; the example promises Node %d", name, p.Engines.Node, want)
		}
	}
	for _, doc := range []string{"README.md", "CONTRIBUTING.md", "cmd/delayd/examples_test.go"} {
		b, err := os.ReadFile(filepath.Join("..", "..", doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`Node (\d+)`).FindAllStringSubmatch(string(b), -1) {
			if m[1] != strconv.Itoa(want) {
				t.Errorf("%s says %q; the example promises Node %d", doc, m[0], want)
			}
		}
	}
}
