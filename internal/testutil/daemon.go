package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Daemon is a delayd process (a binary from BuildBinary) owned by a test,
// for what only a separate process shows: kill -9, exit status, footprint.
// Other tests run the daemon in their own process (internal/daemon/daemontest).
type Daemon struct {
	cmd *exec.Cmd
	Log string // path of its stderr
}

// StartDaemon runs `bin run` against the servers, with test-friendly
// timings and extra DELAYD_* settings ("KEY=value"), and waits until it
// logs that it is ready. The test's cleanup stops it gracefully.
func StartDaemon(t testing.TB, bin string, n *NATS, r *Redis, extra ...string) *Daemon {
	t.Helper()
	cmd := exec.Command(bin, "run")
	cmd.Env = append(append(ChildEnv(),
		"DELAYD_NATS_URL="+n.URL(),
		"DELAYD_REDIS_ADDRS="+r.Addr,
		"DELAYD_SHARDS=4",
		"DELAYD_SCANNER_IDLE_INTERVAL=100ms",
		"DELAYD_HTTP_ADDR=127.0.0.1:0",
		"DELAYD_UI_ADDR=127.0.0.1:0",
		"DELAYD_OWNERSHIP_TTL=1s",
	), extra...)
	d := &Daemon{cmd: cmd, Log: filepath.Join(t.TempDir(), "delayd.log")}
	logf, err := os.Create(d.Log)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start delayd: %v", err)
	}
	t.Cleanup(func() {
		d.Stop()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(d.Log)
			t.Logf("delayd log %s:\n%s", d.Log, b)
		}
	})
	if !Eventually(15*time.Second, func() bool { return d.Logged("delayd: ready") }) {
		b, _ := os.ReadFile(d.Log)
		t.Fatalf("delayd did not log ready:\n%s", b)
	}
	return d
}

// Logged reports whether the daemon's log holds what.
func (d *Daemon) Logged(what string) bool {
	b, _ := os.ReadFile(d.Log)
	return strings.Contains(string(b), what)
}

// Stop stops the daemon with SIGTERM (a graceful shutdown) and waits,
// killing it after 10 s.
func (d *Daemon) Stop() {
	if d.cmd.Process == nil || d.cmd.ProcessState != nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = d.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = d.cmd.Process.Kill()
		<-done
	}
}

// Kill kills the daemon with SIGKILL, as a crash, and waits for it.
func (d *Daemon) Kill() {
	if d.cmd.Process == nil || d.cmd.ProcessState != nil {
		return
	}
	_ = d.cmd.Process.Kill()
	_ = d.cmd.Wait()
}

// ChildEnv is the test's environment for a daemon it starts, without the
// DELAYD_* variables only the tests read (DELAYD_TOOLS_DIR, which test.sh
// sets): a daemon of an earlier build, which refuses a DELAYD_* name it
// does not know, would not start.
func ChildEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DELAYD_TOOLS_DIR=") {
			out = append(out, kv)
		}
	}
	return out
}
