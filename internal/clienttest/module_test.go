// Package clienttest runs the tests of the client module (client/, a module
// of its own so that users can import it from Go 1.21 with nats.go alone) as
// a user of that module builds them: with its own go.mod (GOWORK=off) and the
// Go toolchain of its go line, against a NATS server and a delayd that this
// test starts in its own process. The client's tests cannot start those
// themselves: nats-server and the daemon would become dependencies of the
// client module. The tests that want a delayd or NATS server of their own
// settings run the workspace's client in this process (batching_test.go).
package clienttest

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

const (
	clientModule = "github.com/delayd/delayd/client"
	natsModule   = "github.com/nats-io/nats.go"
	// goLine is the client module's go line: the oldest Go it supports.
	goLine = "1.21"
	// toolchain is the last release of goLine, which the tests run with.
	toolchain = "go1.21.13"
	// urlVar is the variable the client's tests read the server from
	// (client/main_test.go).
	urlVar = "DELAYD_CLIENT_TEST_NATS_URL"
)

// The client module asks for Go 1.21 and requires nats.go alone (at a
// version whose own go line is no higher); the main module requires it at
// the version go.work replaces with the checkout, and has no replace of its
// own, which would break `go install .../cmd/delayd@version`.
func TestModuleFiles(t *testing.T) {
	var client struct {
		Module    struct{ Path string }
		Go        string
		Toolchain string
		Require   []struct {
			Path     string
			Version  string
			Indirect bool
		}
	}
	goJSON(t, &client, "mod", "edit", "-json", "../../client/go.mod")
	var direct []string
	for _, r := range client.Require {
		if !r.Indirect {
			direct = append(direct, r.Path)
		}
	}
	if client.Module.Path != clientModule || client.Go != goLine || client.Toolchain != "" ||
		strings.Join(direct, " ") != natsModule {
		t.Errorf("client/go.mod: module %s, go %s, toolchain %q, requires %v; want %s, go %s, no toolchain, requires %s alone",
			client.Module.Path, client.Go, client.Toolchain, direct, clientModule, goLine, natsModule)
	}

	var main struct {
		Require []struct{ Path, Version string }
		Replace []struct{ Old struct{ Path string } }
	}
	goJSON(t, &main, "mod", "edit", "-json", "../../go.mod")
	required := ""
	for _, r := range main.Require {
		if r.Path == clientModule {
			required = r.Version
		}
	}
	if required == "" || len(main.Replace) != 0 {
		t.Errorf("go.mod: requires %s at %q, replaces %v; want a version and no replace", clientModule, required, main.Replace)
	}

	var work struct {
		Use     []struct{ DiskPath string }
		Replace []struct {
			Old struct{ Path, Version string }
			New struct{ Path string }
		}
	}
	goJSON(t, &work, "work", "edit", "-json", "../../go.work")
	var uses []string
	for _, u := range work.Use {
		uses = append(uses, u.DiskPath)
	}
	if strings.Join(uses, " ") != ". ./client" || len(work.Replace) != 1 || work.Replace[0].Old.Path != clientModule ||
		work.Replace[0].Old.Version != required || work.Replace[0].New.Path != "./client" {
		t.Errorf("go.work: uses %v, replaces %+v; want . and ./client, and %s %s => ./client", uses, work.Replace, clientModule, required)
	}
}

// goJSON runs go with args in this directory and decodes its JSON output.
func goJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
}

// TestClientModule vets and tests the client module at Go 1.21, its tests
// running against a delayd started here. The toolchain comes from the module
// proxy on first use: without it the test skips, and fails under CI=true.
func TestClientModule(t *testing.T) {
	dir, err := filepath.Abs("../../client")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if d, ok := t.Deadline(); ok {
		ctx, cancel = context.WithDeadline(ctx, d.Add(-30*time.Second))
		defer cancel()
	}
	env := clientEnv()
	run := func(extraEnv []string, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = dir
		cmd.Env = append(env, extraEnv...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	if out, err := run(nil, "version"); err != nil || !strings.Contains(out, "go version "+toolchain+" ") {
		if os.Getenv("CI") == "true" {
			t.Fatalf("GOTOOLCHAIN=%s go version (CI=true): %v\n%s", toolchain, err, out)
		}
		t.Skipf("no %s toolchain (GOTOOLCHAIN=%s go version: %v)\n%s", toolchain, toolchain, err, out)
	}
	if out, err := run(nil, "vet", "./..."); err != nil {
		t.Fatalf("go vet ./... at %s: %v\n%s", toolchain, err, out)
	}

	testutil.RedisBinary(t)
	n := testutil.StartNATS(t)
	c := daemontest.Config(n, testutil.StartRedis(t))
	c.Limits.MaxPayload = 65536 // below the 100 kB of TestErrorsFromTheDaemon's 413
	daemontest.Start(t, c)

	args := append([]string{"test"}, testFlags...)
	out, err := run([]string{urlVar + "=" + n.URL()}, append(args, "./...")...)
	if err != nil {
		t.Fatalf("go %s ./... at %s: %v\n%s", strings.Join(args[1:], " "), toolchain, err, out)
	}
	if !strings.Contains(out, "ok  \t"+clientModule) || strings.Contains(out, "skipped") {
		t.Fatalf("the client's tests did not run:\n%s", out)
	}
	t.Logf("at %s:\n%s", toolchain, bytes.TrimSpace([]byte(out)))
}

// testFlags are the flags of the client's test run; -race is added when
// this test runs with -race (race_test.go).
var testFlags = []string{"-count=1", "-timeout=5m"}

// clientEnv is this process's environment for a go command that builds the
// client module as a user would: its own go.mod and go.sum, and the toolchain
// of its go line. GOFLAGS are dropped (this machine's -buildvcs=false is
// harmless, but a -mod=mod would hide a go.sum that is not complete).
func clientEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		switch strings.SplitN(kv, "=", 2)[0] {
		case "GOFLAGS", "GOWORK", "GOTOOLCHAIN", "GOEXPERIMENT", urlVar:
			continue
		}
		env = append(env, kv)
	}
	return append(env, "GOWORK=off", "GOTOOLCHAIN="+toolchain, "GOFLAGS=-mod=readonly")
}
