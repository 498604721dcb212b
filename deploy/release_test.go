package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
	const mod = "github.com/delayd/delayd/client"
	files := releaseFiles()
	r := newReleaseRepo(t, files)
	refused, git, commit := r.refused, r.git, r.commit

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

// releaseFiles are the files of a throwaway repository release.sh can
// release v0.2.0 of, but for the client's tag and checksums: the script,
// the module files, the CHANGELOG and the version-bearing manifests.
func releaseFiles() map[string]string {
	const mod = "github.com/delayd/delayd/client"
	return map[string]string{
		"CHANGELOG.md":                   "# Changelog\n\n## 0.2.0\n",
		"go.mod":                         "module github.com/delayd/delayd\n\ngo 1.26.8\n\nrequire " + mod + " v0.1.0\n",
		"go.work":                        "go 1.26.8\n\nuse (\n\t.\n\t./client\n)\n\nreplace " + mod + " v0.1.0 => ./client\n",
		"go.sum":                         "",
		"client/go.mod":                  "module " + mod + "\n\ngo 1.21\n",
		"client/doc.go":                  "package client\n",
		"deploy/helm/delayd/Chart.yaml":  "apiVersion: v2\nname: delayd\nversion: 0.2.0\nappVersion: \"0.2.0\"\n",
		"deploy/helm/delayd/values.yaml": "image:\n  repository: ghcr.io/delayd/delayd\n  tag: \"\"          # the appVersion\n",
		"deploy/kubernetes/fleet.yaml":   "spec:\n  containers:\n    - image: ghcr.io/delayd/delayd:0.2.0\n",
		"deploy/kubernetes/sidecar.yaml": "spec:\n  containers:\n    - image: \"ghcr.io/delayd/delayd:0.2.0\"\n",
	}
}

// releaseRepo is a throwaway git repository with release.sh in it.
type releaseRepo struct {
	t   *testing.T
	dir string
}

func newReleaseRepo(t *testing.T, files map[string]string) *releaseRepo {
	t.Helper()
	script, err := os.ReadFile("release.sh")
	if err != nil {
		t.Fatal(err)
	}
	r := &releaseRepo{t, t.TempDir()}
	r.write("deploy/release.sh", string(script))
	for name, text := range files {
		r.write(name, text)
	}
	r.git("init", "-q")
	r.git("add", "-A")
	r.git("commit", "-q", "-m", "fixture")
	return r
}

func (r *releaseRepo) write(name, text string) {
	r.t.Helper()
	writeFile(r.t, filepath.Join(r.dir, name), []byte(text))
}

func (r *releaseRepo) git(args ...string) {
	r.t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false"}, args...)...)
	cmd.Dir = r.dir
	if out, err := cmd.CombinedOutput(); err != nil {
		r.t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

// commit writes name and commits it.
func (r *releaseRepo) commit(name, text string) {
	r.t.Helper()
	r.write(name, text)
	r.git("add", "-A")
	r.git("commit", "-q", "-m", name)
}

// run runs release.sh v0.2.0 for one platform, fetching nothing (the last
// client check's lookup of the client fails at once).
func (r *releaseRepo) run(env ...string) (string, int) {
	r.t.Helper()
	cmd := exec.Command("bash", "deploy/release.sh", "--platforms", "linux/amd64", "--out", r.t.TempDir(), "v0.2.0")
	cmd.Dir = r.dir
	cmd.Env = append(append(os.Environ(), "GOPROXY=off", "GOFLAGS="), env...)
	return releaseIn(r.t, cmd)
}

// refused runs a release and wants it refused (exit 1) with each of want
// in its output.
func (r *releaseRepo) refused(step string, want ...string) {
	r.t.Helper()
	out, code := r.run()
	for _, w := range want {
		if code != 1 || !strings.Contains(out, w) {
			r.t.Errorf("%s: exit %d, want 1 and %q in:\n%s", step, code, w, out)
		}
	}
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
	// The first build is signed with a throwaway key, the second is not:
	// a signature changes no archive and no checksum.
	ms := minisign(t)
	keys := t.TempDir()
	sec, pub := filepath.Join(keys, "release.key"), filepath.Join(keys, "release.pub")
	run(t, ms, "-G", "-W", "-s", sec, "-p", pub)
	sums := make([][]byte, 2)
	dirs := []string{t.TempDir(), t.TempDir()}
	for i, dir := range dirs {
		cmd := exec.Command("bash", "release.sh", "--snapshot", "--platforms", "linux/amd64", "--out", dir)
		cmd.Env = append(os.Environ(), "RELEASE_SIGNING_KEY=", "RELEASE_SIGNING_PUBKEY="+pub)
		if i == 0 {
			cmd.Env = append(cmd.Env, "RELEASE_SIGNING_KEY="+sec)
		}
		out, code := releaseIn(t, cmd)
		if code != 0 {
			t.Fatalf("release --snapshot: exit %d\n%s", code, out)
		}
		if signed := strings.Contains(out, "SHA256SUMS.minisig"); signed != (i == 0) || i == 1 && !strings.Contains(out, "NOT signed") {
			t.Errorf("build %d (signed: %v) says:\n%s", i, i == 0, out)
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
	run(t, ms, "-V", "-p", pub, "-m", filepath.Join(dirs[0], "SHA256SUMS"))
	list := run(t, "tar", "-tvzf", archives[0])
	for _, f := range []string{"/delayd", "/LICENSE", "/README.md", "/CHANGELOG.md", "/configs/delayd.yaml", "/systemd/delayd.service"} {
		if !strings.Contains(list, f+"\n") {
			t.Errorf("the archive has no %s:\n%s", f, list)
		}
	}
	if strings.Contains(list, "rw-rw") || strings.Contains(list, "rwxrwx") {
		t.Errorf("group-writable files in the archive:\n%s", list)
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

// changelogVersion is the version CHANGELOG.md's first section is about:
// "## Unreleased (X.Y.Z)" before the release, "## X.Y.Z" after.
var changelogVersion = regexp.MustCompile(`(?m)^## (?:Unreleased \()?(\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?)\)?\s*$`)

// imageRef finds delayd's image in a manifest.
var imageRef = regexp.MustCompile(`ghcr\.io/delayd/delayd:([^\s"']+)`)

// TestOneVersionEverywhere: the chart (version, appVersion and the image
// tag it defaults to) and the plain manifests deploy the version the
// CHANGELOG is about, so a chart never ships another delayd than its own.
// release.sh checks the same at release time (TestReleaseRefusesMixedVersions).
func TestOneVersionEverywhere(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	m := changelogVersion.FindSubmatch(b)
	if m == nil {
		t.Fatal(`CHANGELOG.md has no "## Unreleased (X.Y.Z)" or "## X.Y.Z" section`)
	}
	want := string(m[1])
	chart := docs(t, chartDir+"/Chart.yaml")[0]
	for _, k := range []string{"version", "appVersion"} {
		if chart[k] != want {
			t.Errorf("%s/Chart.yaml %s is %v, the CHANGELOG's version %s", chartDir, k, chart[k], want)
		}
	}
	values := docs(t, chartDir+"/values.yaml")[0]
	if tag := dig(values, "image", "tag"); tag != "" && tag != want {
		t.Errorf("values.yaml image.tag %v: leave it empty (the appVersion)", tag)
	}
	// An unstamped build (go build, go install, go run, a Dockerfile
	// build without --build-arg VERSION) is a prerelease of the version
	// the CHANGELOG is about: never older than the newest release.
	for _, u := range []struct{ file, pattern string }{
		{"../cmd/delayd/cli.go", `var version = "([^"]+)"`},
		{"../internal/daemon/options.go", `const defaultVersion = "([^"]+)"`},
		{"Dockerfile", `ARG VERSION=(\S+)`},
	} {
		b, err := os.ReadFile(u.file)
		if err != nil {
			t.Fatal(err)
		}
		got := "nothing"
		if m := regexp.MustCompile(u.pattern).FindSubmatch(b); m != nil {
			got = string(m[1])
		}
		if got != want+"-dev" {
			t.Errorf("%s: an unstamped build reports %s, want %s-dev (the CHANGELOG's version, unreleased)", u.file, got, want)
		}
	}
	manifests, _ := filepath.Glob("kubernetes/*.yaml")
	for _, f := range manifests {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range imageRef.FindAllSubmatch(b, -1) {
			if string(m[1]) != want {
				t.Errorf("%s deploys delayd %s, the CHANGELOG's version is %s", f, m[1], want)
			}
		}
	}
}

// A release is one version everywhere: release.sh refuses one whose chart
// (version, appVersion, image tag), plain manifests or CHANGELOG name
// another, listing each, before it looks at the client.
func TestReleaseRefusesMixedVersions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, file, from, to string
		want                 []string
	}{
		{"chart appVersion", "deploy/helm/delayd/Chart.yaml", `appVersion: "0.2.0"`, `appVersion: "0.1.0"`,
			[]string{"deploy/helm/delayd/Chart.yaml has appVersion 0.1.0, not 0.2.0"}},
		{"chart version", "deploy/helm/delayd/Chart.yaml", "version: 0.2.0\n", "version: 0.2.1\n",
			[]string{"deploy/helm/delayd/Chart.yaml has version 0.2.1, not 0.2.0"}},
		{"image tag", "deploy/helm/delayd/values.yaml", `tag: ""`, `tag: "0.1.0"`,
			[]string{"deploy/helm/delayd/values.yaml has image.tag 0.1.0, not 0.2.0"}},
		{"manifest", "deploy/kubernetes/sidecar.yaml", "delayd:0.2.0", "delayd:0.1.0",
			[]string{"deploy/kubernetes/sidecar.yaml deploys ghcr.io/delayd/delayd:0.1.0, not 0.2.0"}},
		{"unreleased section", "CHANGELOG.md", "## 0.2.0\n", "## Unreleased (0.2.0)\n",
			[]string{`CHANGELOG.md has no "## 0.2.0" section`}},
		{"newer section above", "CHANGELOG.md", "## 0.2.0\n", "## Unreleased (0.3.0)\n\n## 0.2.0\n",
			[]string{`CHANGELOG.md is about 0.3.0 (its first section), not 0.2.0`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			files := releaseFiles()
			if !strings.Contains(files[tc.file], tc.from) {
				t.Fatalf("%s has no %q", tc.file, tc.from)
			}
			files[tc.file] = strings.Replace(files[tc.file], tc.from, tc.to, 1)
			r := newReleaseRepo(t, files)
			r.refused(tc.name, tc.want...)
			if out, _ := r.run(); strings.Contains(out, "go.mod requires") {
				t.Errorf("the client was checked before the versions:\n%s", out)
			}
		})
	}
	// All agreeing, the versions pass and the client is next.
	r := newReleaseRepo(t, releaseFiles())
	r.refused("consistent", "go.mod requires github.com/delayd/delayd/client v0.1.0, not v0.2.0")
}

// minisign returns the minisign binary, the release signing tool.
func minisign(t *testing.T) string {
	t.Helper()
	return tool(t, "minisign", "apt-get install minisign")
}

// With RELEASE_SIGNING_KEY, release.sh --sign DIR checks DIR's archives
// against SHA256SUMS and signs it with minisign; the signature verifies
// with the public key, and a changed SHA256SUMS does not. Without a key
// it says that nothing is signed and exits 1. A throwaway key, made here.
func TestReleaseSignsChecksums(t *testing.T) {
	t.Parallel()
	ms := minisign(t)
	keys := t.TempDir()
	sec, pub := filepath.Join(keys, "release.key"), filepath.Join(keys, "release.pub")
	run(t, ms, "-G", "-W", "-s", sec, "-p", pub)

	dist := t.TempDir()
	writeFile(t, filepath.Join(dist, "delayd_0.2.0_linux_amd64.tar.gz"), []byte("an archive"))
	sha := exec.Command("sha256sum", "delayd_0.2.0_linux_amd64.tar.gz")
	sha.Dir = dist
	sums, err := sha.Output()
	if err != nil {
		t.Fatal(err)
	}
	sumsPath := filepath.Join(dist, "SHA256SUMS")
	writeFile(t, sumsPath, sums)
	cmdIn := func(dir string, env ...string) (string, int) {
		cmd := exec.Command("bash", "release.sh", "--sign", dir)
		cmd.Env = append(os.Environ(), env...)
		return releaseIn(t, cmd)
	}

	if out, code := cmdIn(dist, "RELEASE_SIGNING_KEY="); code != 1 || !strings.Contains(out, "RELEASE_SIGNING_KEY") {
		t.Errorf("--sign without a key: exit %d, %q", code, out)
	}
	out, code := cmdIn(dist, "RELEASE_SIGNING_KEY="+sec, "RELEASE_SIGNING_PUBKEY="+pub)
	if code != 0 || !strings.Contains(out, "SHA256SUMS.minisig") {
		t.Fatalf("--sign: exit %d\n%s", code, out)
	}
	verify := run(t, ms, "-V", "-p", pub, "-m", sumsPath)
	if !strings.Contains(verify, "delayd 0.2.0") {
		t.Errorf("the trusted comment does not name the release: %s", verify)
	}
	if err := os.WriteFile(sumsPath, []byte("0000  delayd_0.2.0_linux_amd64.tar.gz\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := tryRun(ms, "-V", "-p", pub, "-m", sumsPath); err == nil {
		t.Error("a changed SHA256SUMS verifies")
	}
	// An archive that does not match its checksum is not signed.
	if out, code := cmdIn(dist, "RELEASE_SIGNING_KEY="+sec); code != 1 || !strings.Contains(out, "do not match") {
		t.Errorf("--sign with a wrong checksum: exit %d, %q", code, out)
	}
}
