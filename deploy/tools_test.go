package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// helmVersion is the helm the chart is checked with; CI and developers
// get the same binary, built from the module proxy into a cache dir.
const helmVersion = "v3.21.4"

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// ci reports whether missing tools must fail the tests instead of
// skipping them.
func ci() bool { return os.Getenv("CI") == "true" }

// need skips the test when a tool is missing, or fails it under CI=true.
func need(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if ci() {
		t.Fatalf("CI=true and %v", err)
	}
	t.Skip(err)
}

// toolsDir is where pinned tools are installed: .ci/run uses the same.
func toolsDir() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "delayd-tools")
}

// helm returns the pinned helm binary, installing it with go install
// (through the module proxy) the first time.
func helm(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() {
		if p := os.Getenv("DELAYD_HELM"); p != "" {
			helmPath = p
			return
		}
		dir := filepath.Join(toolsDir(), "helm-"+helmVersion)
		helmPath = filepath.Join(dir, "helm")
		if _, err := os.Stat(helmPath); err == nil {
			return
		}
		cmd := exec.Command("go", "install", "helm.sh/helm/v3/cmd/helm@"+helmVersion)
		cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			helmErr = &toolError{"helm " + helmVersion + " (go install)", err, out}
		}
	})
	need(t, helmErr)
	return helmPath
}

// tool returns a tool from PATH.
func tool(t *testing.T, name, hint string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		need(t, &toolError{name + " (" + hint + ")", err, nil})
	}
	return p
}

type toolError struct {
	tool string
	err  error
	out  []byte
}

func (e *toolError) Error() string {
	return "missing " + e.tool + ": " + e.err.Error() + " " + strings.TrimSpace(string(e.out))
}

// run runs a command and returns its stdout, failing the test with its
// stderr when it fails.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := tryRun(name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v", filepath.Base(name), strings.Join(args, " "), err)
	}
	return out
}

// tryRun runs a command and returns its stdout, or an error with stderr.
func tryRun(name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), &runError{err, stdout.String() + stderr.String()}
	}
	return stdout.String(), nil
}

type runError struct {
	err error
	out string
}

func (e *runError) Error() string { return e.err.Error() + "\n" + e.out }

// copyDir copies a directory tree (charts are small).
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}
