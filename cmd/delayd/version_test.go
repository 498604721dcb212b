package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/testutil"
)

// TestBuiltBinariesStart builds the daemon the ways users build it and
// starts each: go build in a clone stamps a pseudo-version
// (v0.0.0-<time>-<commit>, +dirty for a modified tree), a release build
// sets -X main.version=v0.2.0, and anything else may come through -X. NATS
// micro refuses a version that is not SemVer without its "v", and such a
// binary used to exit at once ("version should match the SemVer format"),
// unseen by tests whose builds ran under this machine's -buildvcs=false.
func TestBuiltBinariesStart(t *testing.T) {
	t.Parallel()
	if err := exec.Command("git", "rev-parse", "--git-dir").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("not a git checkout, so go build cannot stamp a version: %v", err)
		}
		t.Skipf("not a git checkout, so go build cannot stamp a version: %v", err)
	}
	for _, b := range []struct {
		name  string
		flags []string
		want  string // in `delayd version`
	}{
		{"buildvcs", []string{"-buildvcs=true"}, "delayd "},
		{"pseudo", []string{"-ldflags=-X main.version=v0.0.0-20261201171517-a451f2be0959+dirty"}, "delayd v0.0.0-20261201171517-a451f2be0959+dirty "},
		{"release", []string{"-ldflags=-X main.version=v0.2.0"}, "delayd v0.2.0 "},
		{"odd", []string{"-ldflags=-X 'main.version=nightly build'"}, "delayd nightly build "},
	} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			bin := filepath.Join(t.TempDir(), "delayd")
			build := exec.Command("go", append(append([]string{"build"}, b.flags...), "-o", bin, ".")...)
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("go build %v: %v\n%s", b.flags, err, out)
			}
			out, err := exec.Command(bin, "version").CombinedOutput()
			if err != nil || !strings.Contains(string(out), b.want) {
				t.Fatalf("delayd version = %q (%v), want it to contain %q", out, err, b.want)
			}
			if stamped, _ := exec.Command("go", "version", "-m", bin).Output(); bytes.Contains(stamped, []byte("vcs.revision=")) &&
				!strings.Contains(string(out), " commit ") {
				t.Errorf("delayd version = %q: the build has a commit, the line does not name it", out)
			}
			version := strings.Fields(string(out))[1]
			if b.name == "odd" {
				version = "nightly build"
			}

			url := fmt.Sprintf("nats://127.0.0.1:%d", testutil.FreePort(t))
			ctx, cancel := context.WithCancel(context.Background())
			var logs syncBuffer
			cmd := exec.CommandContext(ctx, bin, "run", "--embedded", "--nats-url", url,
				"--set", "http.addr=127.0.0.1:0", "--set", "ui.addr=127.0.0.1:0")
			cmd.Stdout, cmd.Stderr = &logs, &logs
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			defer func() { cancel(); <-exited }()

			// Started means serving: the micro service answers with the
			// version the build carries, mapped to SemVer.
			if !testutil.Eventually(30*time.Second, func() bool {
				select {
				case err := <-exited:
					exited <- err
					t.Fatalf("%s exited: %v\n%s", bin, err, logs.String())
				default:
				}
				info, ok := serviceInfo(url)
				if ok {
					if want := bridge.ServiceVersion(version); info.Version != want {
						t.Fatalf("service version %q, want %q (from %q)", info.Version, want, version)
					}
				}
				return ok
			}) {
				t.Fatalf("no service info within 30 s:\n%s", logs.String())
			}
		})
	}
}

// serviceInfo asks the delayd micro service at url for its info.
func serviceInfo(url string) (info struct{ Version string }, ok bool) {
	nc, err := nats.Connect(url, nats.Timeout(time.Second))
	if err != nil {
		return info, false
	}
	defer nc.Close()
	m, err := nc.Request("$SRV.INFO.delayd", nil, time.Second)
	if err != nil || json.Unmarshal(bytes.TrimSpace(m.Data), &info) != nil {
		return info, false
	}
	return info, true
}
