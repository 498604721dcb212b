package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/delayd/delayd/internal/testutil/toollock"
)

// helmVersion is the helm the chart is checked with; CI and developers
// get the same binary, built from the module proxy into a cache dir.
const helmVersion = "v3.21.4"

// helmKubeMinor is the Kubernetes minor version of helmVersion's k8s.io
// modules (v0.36.2): helm's Makefile links it in as the version helm
// template and lint assume without a cluster. A plain go install leaves
// 1.20, which the chart's kubeVersion (>= 1.29) refuses. ./test.sh builds
// with the same flags (helmLDFlags) into the same dir.
const helmKubeMinor = "36"

// helmLDFlags are the -ldflags of the pinned helm build.
var helmLDFlags = strings.Join([]string{
	"-X helm.sh/helm/v3/internal/version.version=" + helmVersion,
	"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1",
	"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=" + helmKubeMinor,
	"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1",
	"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=" + helmKubeMinor,
}, " ")

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

// toolsDir is where pinned tools are installed: ./test.sh uses the same.
func toolsDir() string { return toollock.Dir() }

// helm returns the pinned helm binary, installing it with go install
// (through the module proxy) the first time.
func helm(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() {
		if p := os.Getenv("DELAYD_HELM"); p != "" {
			helmPath = p
			return
		}
		// The dir names the Kubernetes version too: a helm of the same
		// version installed without the flags must not be taken.
		dir := filepath.Join(toolsDir(), "helm-"+helmVersion+"-k8s1."+helmKubeMinor)
		helmPath = filepath.Join(dir, "helm")
		// ./test.sh may be building it in the background: wait for
		// that rather than build it twice.
		defer toollock.Lock(dir)()
		if _, err := os.Stat(helmPath); err == nil {
			return
		}
		cmd := exec.Command("go", "install", "-ldflags="+helmLDFlags, "helm.sh/helm/v3/cmd/helm@"+helmVersion)
		cmd.Dir = toolsDir() // away from the checkout's go.work
		cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=")
		if err := os.MkdirAll(cmd.Dir, 0o755); err != nil {
			helmErr = err
			return
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			helmErr = &toolError{"helm " + helmVersion + " (go install " + strings.Join(cmd.Args[2:], " ") + ")", err, out}
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

// TestTestShBuildsThePinnedHelm: ./test.sh installs helm where helm()
// looks, with the same Kubernetes version linked in, in the background,
// saying how long it takes.
func TestTestShBuildsThePinnedHelm(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../test.sh")
	if err != nil {
		t.Fatal(err)
	}
	// In the background, under the lock helm() takes (toollock), so a
	// fresh machine reaches its first test minutes before helm is built.
	for _, want := range []string{"go_tool_bg helm-" + helmVersion + "-k8s1." + helmKubeMinor + " helm helm.sh/helm/v3/cmd/helm@" + helmVersion,
		`exec 9>"$1.lock" && flock 9`, "installing $what in the background (first run only: about $4 min",
		"k8sVersionMinor=" + helmKubeMinor, "version.version=" + helmVersion, "pkg in chartutil lint/rules",
		// Nothing before the tests waits on a build (a fresh machine spent
		// 4.5 min on staticcheck before its first test): it builds beside
		// them and runs after them; each build says when it is done.
		"go_tool_bg staticcheck-", "wait_tool staticcheck-", "installed, ${SECONDS}s after test.sh started it"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("test.sh does not say %q", want)
		}
	}
}
