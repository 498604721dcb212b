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
	return releaseIn(t, exec.Command("bash", append([]string{"release.sh"}, args...)...))
}

// releaseIn runs cmd, a run of release.sh, and returns its output and exit
// code.
func releaseIn(t *testing.T, cmd *exec.Cmd) (string, int) {
	t.Helper()
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

// A release comes after the client module's: go.mod requires the client at
// the version being released, go.work replaces that version with ./client,
// the tag client/vX is made first at a commit with the same client/, and
// go.sum has its checksums. Each step refused says what to do. Checked in a
// throwaway repository with the script and the module files alone.
func TestReleaseNeedsTheClientFirst(t *testing.T) {
	t.Parallel()
	script, err := os.ReadFile("release.sh")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	const mod = "github.com/delayd/delayd/client"
	files := map[string]string{
		"deploy/release.sh": string(script),
		"CHANGELOG.md":      "# Changelog\n\n## 0.2.0\n",
		"go.mod":            "module github.com/delayd/delayd\n\ngo 1.26.8\n\nrequire " + mod + " v0.1.0\n",
		"go.work":           "go 1.26.8\n\nuse (\n\t.\n\t./client\n)\n\nreplace " + mod + " v0.1.0 => ./client\n",
		"go.sum":            "",
		"client/go.mod":     "module " + mod + "\n\ngo 1.21\n",
		"client/doc.go":     "package client\n",
	}
	write := func(name, text string) { t.Helper(); writeFile(t, filepath.Join(dir, name), []byte(text)) }
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false"}, args...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	commit := func(name, text string) {
		t.Helper()
		write(name, text)
		git("add", "-A")
		git("commit", "-q", "-m", name)
	}
	for name, text := range files {
		write(name, text)
	}
	git("init", "-q")
	git("add", "-A")
	git("commit", "-q", "-m", "fixture")
	refused := func(step string, want ...string) {
		t.Helper()
		cmd := exec.Command("bash", "deploy/release.sh", "--platforms", "linux/amd64", "--out", t.TempDir(), "v0.2.0")
		cmd.Dir = dir
		// Nothing is fetched: the last check's lookup of the client fails at once.
		cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=")
		out, code := releaseIn(t, cmd)
		for _, w := range want {
			if code != 1 || !strings.Contains(out, w) {
				t.Errorf("%s: exit %d, want 1 and %q in:\n%s", step, code, w, out)
			}
		}
	}

	refused("client required at another version", "go.mod requires "+mod+" v0.1.0, not v0.2.0", "go mod edit -require="+mod+"@v0.2.0")
	commit("go.mod", strings.Replace(files["go.mod"], "v0.1.0", "v0.2.0", 1))
	refused("go.work replacing another version", "go.work does not replace "+mod+" v0.2.0")
	commit("go.work", strings.Replace(files["go.work"], "v0.1.0", "v0.2.0", 1))
	refused("no client tag", "released first, as client/v0.2.0", "git tag -a client/v0.2.0", "git push origin client/v0.2.0", "GOWORK=off go mod tidy")
	git("tag", "client/v0.2.0")
	commit("client/doc.go", "// Package client changed after its tag.\npackage client\n")
	refused("client changed since its tag", "client/ changed since the tag client/v0.2.0", "client/doc.go")
	git("tag", "-f", "client/v0.2.0")
	refused("no checksums", "go.sum has no checksums for "+mod+" v0.2.0")
	commit("go.sum", mod+" v0.2.0 h1:AAAA=\n"+mod+" v0.2.0/go.mod h1:AAAA=\n")
	refused("client not published", "does not build with the published client/v0.2.0")
}

// writeFile writes data at p, making its directories.
func writeFile(t *testing.T, p string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
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
