package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// release runs deploy/release.sh with args and returns its output and
// exit code.
func release(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{"release.sh"}, args...)...)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// The release script refuses what is not a release before it builds
// anything: a version that is not semantic (2), a version without its
// CHANGELOG section or a modified tree (1).
func TestReleaseRefuses(t *testing.T) {
	t.Parallel()
	if out, code := release(t, "1.2"); code != 2 || !strings.Contains(out, "not a semantic version") {
		t.Errorf("1.2: exit %d, %q", code, out)
	}
	if out, code := release(t, "v99.0.0"); code != 1 || !strings.Contains(out, "CHANGELOG.md") && !strings.Contains(out, "uncommitted") {
		t.Errorf("v99.0.0: exit %d, %q", code, out)
	}
	if out, code := release(t, "--snapshot", "v1.0.0"); code != 2 {
		t.Errorf("--snapshot with a version: exit %d, %q", code, out)
	}
}

// Two builds of the same tree give the same bytes (the checksums agree),
// and the binary names its version and commit. Builds take a while:
// DELAYD_SOAK=1 runs it.
func TestReleaseIsReproducible(t *testing.T) {
	if os.Getenv("DELAYD_SOAK") == "" {
		t.Skip("builds delayd twice; DELAYD_SOAK=1 runs it")
	}
	t.Parallel()
	sums := make([][]byte, 2)
	dirs := []string{t.TempDir(), t.TempDir()}
	for i, dir := range dirs {
		if out, code := release(t, "--snapshot", "--platforms", "linux/amd64", "--out", dir); code != 0 {
			t.Fatalf("release --snapshot: exit %d\n%s", code, out)
		}
		b, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
		if err != nil {
			t.Fatal(err)
		}
		sums[i] = b
	}
	if !bytes.Equal(sums[0], sums[1]) {
		t.Fatalf("two builds of one tree differ:\n%s\n%s", sums[0], sums[1])
	}
	archives, _ := filepath.Glob(filepath.Join(dirs[0], "delayd_*_linux_amd64.tar.gz"))
	if len(archives) != 1 {
		t.Fatalf("archives: %v", archives)
	}
	if out, err := exec.Command("tar", "-xzf", archives[0], "-C", dirs[0]).CombinedOutput(); err != nil {
		t.Fatalf("untar: %v %s", err, out)
	}
	bins, _ := filepath.Glob(filepath.Join(dirs[0], "delayd_*_linux_amd64", "delayd"))
	if len(bins) != 1 {
		t.Fatalf("binary: %v", bins)
	}
	out, err := exec.Command(bins[0], "version").Output()
	commit, _ := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil || !strings.Contains(string(out), "snapshot") || !strings.Contains(string(out), strings.TrimSpace(string(commit))) {
		t.Fatalf("delayd version: %q (%v), want the snapshot version and commit %s", out, err, commit)
	}
}
