package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// TestBinaryFlagsAndSignals runs the built binary as users run it, with
// every setting on its command line (no DELAYD_* from the environment):
// run with the config flags and --set; the client commands (schedule,
// get, list, cancel) and the operator ones (stats, dead list) with their
// connection flag; doctor with --redis-addrs; config and healthcheck with
// --set; completion. It checks the exit statuses (0 ok, 1 not found, 2
// usage) and that SIGTERM and SIGINT each stop the daemon gracefully
// (status 0); SIGKILL is crash_test.go's. The CLI's behaviour in detail
// is tested in-process (cli_test.go).
func TestBinaryFlagsAndSignals(t *testing.T) {
	t.Parallel()
	bin := delaydBinary(t)
	e := daemontest.NewEnv(t)
	admin := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DELAYD_") {
			env = append(env, kv)
		}
	}
	delayd := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		switch {
		case errors.As(err, &exit):
			return string(out), exit.ExitCode()
		case err != nil:
			t.Fatalf("delayd %v: %v", args, err)
		}
		return string(out), 0
	}
	want := func(code int, args ...string) string {
		t.Helper()
		out, got := delayd(args...)
		if got != code {
			t.Errorf("delayd %s: exit %d, want %d\n%s", strings.Join(args, " "), got, code, out)
		}
		return out
	}
	start := func(name string) *exec.Cmd {
		t.Helper()
		log := filepath.Join(t.TempDir(), name+".log")
		f, err := os.Create(log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		cmd := exec.Command(bin, "run", "--nats-url", e.NATS.URL(), "--redis-addrs", e.Redis.Addr, "--log-level", "info",
			"--set", "shards=4", "--set", "http.addr="+admin, "--set", "ui.addr=127.0.0.1:0", "--set", "ownership.ttl=1s")
		cmd.Env, cmd.Stderr = env, f
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		if !testutil.Eventually(15*time.Second, func() bool {
			b, _ := os.ReadFile(log)
			return strings.Contains(string(b), "delayd: ready")
		}) {
			b, _ := os.ReadFile(log)
			t.Fatalf("delayd run did not log ready:\n%s", b)
		}
		return cmd
	}
	stop := func(cmd *exec.Cmd, sig os.Signal) {
		t.Helper()
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("delayd run stopped by %v: %v, want exit status 0", sig, err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("delayd run did not stop within 15 s of %v", sig)
		}
	}

	d := start("sigterm")
	nats := []string{"--nats-url", e.NATS.URL()}
	if out := want(0, append([]string{"schedule", "--target", "bin.t", "--delay", "1h", "--id", "b1", "x"}, nats...)...); !strings.Contains(out, "b1") {
		t.Errorf("schedule printed %q", out)
	}
	if out := want(0, append([]string{"get", "b1"}, nats...)...); !strings.Contains(out, "bin.t") {
		t.Errorf("get printed %q", out)
	}
	if out := want(0, append([]string{"list"}, nats...)...); !strings.Contains(out, "b1") {
		t.Errorf("list printed %q", out)
	}
	want(0, append([]string{"stats"}, nats...)...)
	want(0, append([]string{"dead", "list"}, nats...)...)
	want(0, append([]string{"cancel", "b1"}, nats...)...)
	want(1, append([]string{"get", "b1"}, nats...)...)
	want(2, append([]string{"schedule", "--target", "bin.t", "--delay", "1s", "--delay", "2s", "x"}, nats...)...)
	want(0, "doctor", "--redis-addrs", e.Redis.Addr, "--set", "shards=4")
	if out := want(0, "config", "--set", "shards=4", "--nats-url", e.NATS.URL()); !strings.Contains(out, e.NATS.URL()) {
		t.Errorf("config does not show the --nats-url it was given:\n%s", out)
	}
	want(1, "config", "--set", "no.such.key=1") // a refused config, not a usage mistake
	// The log's "ready" comes before /readyz's 200, which waits for the
	// delivery inbox to be proven (operations.md): the exit status of a
	// ready daemon's healthcheck is what is tested here, not the start.
	if !testutil.Eventually(10*time.Second, func() bool { return daemontest.Readyz(admin) }) {
		t.Fatal("/readyz not 200 within 10 s")
	}
	want(0, "healthcheck", "--set", "http.addr="+admin)
	want(0, "completion", "bash")
	stop(d, syscall.SIGTERM)
	want(1, "healthcheck", "--set", "http.addr="+admin, "--timeout", "1s")

	stop(start("sigint"), os.Interrupt)
}
