package main

import (
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// TestMain runs more tests at once than go test's default of one per CPU:
// the tests of the binary (as the daemon suite in internal/daemon/systest,
// whose TestMain does the same) spend their time waiting (for timers to
// fall due, leases to expire, a killed process to be replaced), each on its
// own redis-server and nats-server, so a 2-core machine runs several side
// by side. An explicit -parallel still wins. It removes the shared daemon
// binary at the end.
func TestMain(m *testing.M) {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		_ = flag.Set("test.parallel", strconv.Itoa(max(6, 3*runtime.GOMAXPROCS(0))))
	}
	code := m.Run()
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
	}
	releaseDirs.Range(func(dir, _ any) bool { _ = os.RemoveAll(dir.(string)); return true })
	os.Exit(code)
}

// shared is the daemon binary, built once for every test that needs a real
// process (kill -9, exit codes, memory limits).
var shared struct {
	once      sync.Once
	dir, path string
	err       error
}

// delaydBinary builds ./cmd/delayd once per test run and returns its path.
func delaydBinary(t testing.TB) string {
	t.Helper()
	shared.once.Do(func() {
		if shared.dir, shared.err = os.MkdirTemp("", "delayd-test-bin-"); shared.err != nil {
			return
		}
		shared.path = filepath.Join(shared.dir, "delayd")
		if out, err := exec.Command("go", "build", "-o", shared.path, ".").CombinedOutput(); err != nil {
			shared.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.path
}

// knownFailingSoaks are soaks .ci/run leaves out, each with the reason and
// the issue that owns it; TestSoaksRunInCI fails on any other omission, and
// on one listed here that .ci/run runs again (then drop it here).
var knownFailingSoaks = map[string]string{}

// TestSoaksRunInCI: every test that daemontest.Soak gates, in this package
// or in the daemon suite (internal/daemon/systest), is named in .ci/run's
// soak step, so a new soak does not silently drop out of CI.
func TestSoaksRunInCI(t *testing.T) {
	t.Parallel()
	ci, err := os.ReadFile(filepath.Join("..", "..", ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^soaks='([^']+)'$`).FindSubmatch(ci)
	if m == nil {
		t.Fatal(".ci/run has no soaks='...' line")
	}
	listed := regexp.MustCompile(string(m[1]))
	gated := regexp.MustCompile(`func (Test\w+)\(t \*testing\.T\) \{\n\tdaemontest\.Soak\(t, `)
	files, _ := filepath.Glob("*_test.go")
	suite, _ := filepath.Glob(filepath.Join("..", "..", "internal", "daemon", "systest", "*_test.go"))
	files = append(files, suite...)
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range gated.FindAllSubmatch(b, -1) {
			n++
			why, known := knownFailingSoaks[string(g[1])]
			switch {
			case known && listed.Match(g[1]):
				t.Errorf("%s is run by .ci/run again: take it out of knownFailingSoaks", g[1])
			case known:
				t.Logf("%s is left out of CI: %s", g[1], why)
			case !listed.Match(g[1]):
				t.Errorf("%s (%s) is a soak that .ci/run's soaks= does not run", g[1], f)
			}
		}
	}
	if n == 0 {
		t.Fatal("found no test gated by daemontest.Soak(): the pattern went stale")
	}
}

// TestCIRunsTheReadmeTestCommand: the README's test command is the one
// that sets a fresh machine up (./test.sh installs every tool the tests
// need, so none of them skips), .ci/run runs exactly it, and CONTRIBUTING
// shows the same.
func TestCIRunsTheReadmeTestCommand(t *testing.T) {
	t.Parallel()
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join("..", "..", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	block := regexp.MustCompile("(?s)\n## Tests\n.*?```sh\n([^\n]*)\n```").FindStringSubmatch(read("README.md"))
	if block == nil {
		t.Fatal("README.md has no sh block under \"## Tests\"")
	}
	const want = "./test.sh"
	if cmd := block[1]; cmd != want {
		t.Fatalf("README's test command is %q, want %q: a bare go test skips what is not installed", cmd, want)
	}
	if fi, err := os.Stat(filepath.Join("..", "..", "test.sh")); err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("test.sh is missing or not executable: %v", err)
	}
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(want) + `$`).MatchString(read(".ci/run")) {
		t.Errorf(".ci/run does not run the README's test command %q on a line of its own", want)
	}
	if !strings.Contains(read("CONTRIBUTING.md"), "```sh\n"+want+"\n") {
		t.Errorf("CONTRIBUTING.md does not show the README's test command %q", want)
	}
}

// previousRelease is the commit of the release before the stored-format
// switch: the daemon a rolling upgrade meets (docs/operations.md,
// Upgrading).
const previousRelease = "9095ff6"

// beforeIntegerLeases is the last commit before stored format 3 (integer
// lease scores): the daemon that rolling upgrade meets.
const beforeIntegerLeases = "5f3b025"

// releases are daemon binaries built from earlier commits, once per run;
// TestMain removes their source trees.
var (
	releases    sync.Map // commit → func() (string, error)
	releaseDirs sync.Map // source tree → true
)

// releaseBinary builds ./cmd/delayd as it was at commit, from this
// repository's history, the way go install builds it (GOWORK=off). A
// commit's source never changes, so the binary is kept across runs in the
// user's cache dir (delayd-test-releases), under the full commit id, the
// Go version and the build settings that could change it: a run builds
// it again only when one of those changed or the cache was cleared, and
// does not spend a link of the whole daemon per commit on every run.
func releaseBinary(t testing.TB, commit string) string {
	t.Helper()
	build, _ := releases.LoadOrStore(commit, sync.OnceValues(func() (string, error) {
		full, err := exec.Command("git", "rev-parse", "--verify", "--quiet", commit+"^{commit}").Output()
		if err != nil {
			return "", fmt.Errorf("commit %s is not in this clone (git rev-parse: %v)", commit, err)
		}
		cached := releaseCachePath(strings.TrimSpace(string(full)))
		if fi, err := os.Stat(cached); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return cached, nil
		}
		src, err := os.MkdirTemp("", "delayd-release-")
		if err != nil {
			return "", err
		}
		releaseDirs.Store(src, true)
		archive := exec.Command("sh", "-c", "cd \"$(git rev-parse --show-toplevel)\" && git archive "+commit+" | tar -x -C "+src)
		if out, err := archive.CombinedOutput(); err != nil {
			return "", fmt.Errorf("commit %s is not in this clone (git archive: %v: %s)", commit, err, out)
		}
		bin := filepath.Join(src, "delayd-"+commit)
		cmd := exec.Command("go", "build", "-o", bin, "./cmd/delayd")
		// A commit with a workspace (the client a module of its own since
		// 0.2.0) builds in it; one without, alone.
		work := "GOWORK=off"
		if _, err := os.Stat(filepath.Join(src, "go.work")); err == nil {
			work = "GOWORK=" + filepath.Join(src, "go.work")
		}
		cmd.Dir, cmd.Env = src, append(os.Environ(), work)
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go build at %s: %v\n%s", commit, err, out)
		}
		if cached == "" {
			return bin, nil
		}
		// Into the cache whole or not at all: a rename in its directory,
		// so a concurrent run sees either no binary or a complete one.
		if err := os.MkdirAll(filepath.Dir(cached), 0o755); err != nil {
			return bin, nil
		}
		tmp, err := os.CreateTemp(filepath.Dir(cached), ".tmp-")
		if err != nil {
			return bin, nil
		}
		defer os.Remove(tmp.Name())
		b, err := os.Open(bin)
		if err == nil {
			_, err = io.Copy(tmp, b)
			b.Close()
		}
		if err := errors.Join(err, tmp.Chmod(0o755), tmp.Close()); err != nil {
			return bin, nil
		}
		if err := os.Rename(tmp.Name(), cached); err != nil {
			return bin, nil
		}
		return cached, nil
	}))
	bin, err := build.(func() (string, error))()
	if err != nil {
		if os.Getenv("CI") != "true" && strings.Contains(err.Error(), "not in this clone") {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	return bin
}

// releaseCachePath is where releaseBinary keeps the binary of the full
// commit id, "" without a user cache dir. The name holds what else the
// binary depends on: the Go version (the go command that builds it is
// the one that built this test) and the environment settings of a build.
func releaseCachePath(full string) string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	h := sha256.New()
	for _, k := range []string{"GOFLAGS", "CGO_ENABLED", "GOEXPERIMENT", "GOAMD64", "GOARM64", "GOTOOLCHAIN", "CC"} {
		fmt.Fprintf(h, "%s=%s\n", k, os.Getenv(k))
	}
	name := fmt.Sprintf("%s-%s-%s-%s-%x", full, runtime.Version(), runtime.GOOS, runtime.GOARCH, h.Sum(nil)[:6])
	name = regexp.MustCompile(`[^A-Za-z0-9._-]+`).ReplaceAllString(name, "_")
	return filepath.Join(dir, "delayd-test-releases", name, "delayd")
}

// TestFuzzTargetsRunInCI: every fuzz target of the module is fuzzed by
// .ci/run (its seed corpus alone runs with the tests), so a new one does
// not silently go unfuzzed.
func TestFuzzTargetsRunInCI(t *testing.T) {
	t.Parallel()
	ci, err := os.ReadFile(filepath.Join("..", "..", ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	target := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(f \*testing\.F\)`)
	n := 0
	err = filepath.WalkDir(filepath.Join("..", ".."), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != filepath.Join("..", "..") {
			if d != nil && d.IsDir() {
				return filepath.SkipDir
			}
			return err
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range target.FindAllSubmatch(b, -1) {
			n++
			if !regexp.MustCompile(`\b` + string(m[1]) + `\b`).Match(ci) {
				t.Errorf("%s (%s) is a fuzz target that .ci/run does not fuzz", m[1], path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("found no fuzz target: the pattern went stale")
	}
}
