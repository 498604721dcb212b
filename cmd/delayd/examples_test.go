package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil/toollock"
)

// natscliVersion is the nats CLI examples/shell is written and checked
// against; ./test.sh installs it into the same cache dir.
const natscliVersion = "v0.5.0"

var examplesDir = filepath.Join("..", "..", "examples")

// needTool skips the test with how to install a missing tool, or fails it
// under CI=true, which ./test.sh sets after installing every tool.
func needTool(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and %s", msg)
	}
	t.Skip(msg)
}

// nodeExample returns node and checks the example's dependencies are there.
func nodeExample(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		needTool(t, "node not found (install Node 18 or later): %v", err)
	}
	if _, err := os.Stat(filepath.Join(examplesDir, "node", "node_modules", "@nats-io", "transport-node", "package.json")); err != nil {
		needTool(t, "examples/node has no node_modules: run (cd examples/node && npm ci) or ./test.sh")
	}
	return node
}

// natscli returns the directory holding the pinned nats CLI: the tools
// cache dir ./test.sh installs it into, else PATH when that one is the same
// version (examples/shell depends on its flags and output).
func natscli(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(toollock.Dir(), "natscli-"+natscliVersion)
	toollock.Lock(dir)() // ./test.sh may be building it in the background
	if _, err := os.Stat(filepath.Join(dir, "nats")); err == nil {
		return dir
	}
	if p, err := exec.LookPath("nats"); err == nil {
		out, _ := exec.Command(p, "--version").Output()
		if strings.TrimSpace(string(out)) == natscliVersion {
			return filepath.Dir(p)
		}
	}
	needTool(t, "nats CLI %s not found in %s or PATH: run ./test.sh, or GOBIN=%s GOFLAGS= go install github.com/nats-io/natscli/nats@%s",
		natscliVersion, dir, dir, natscliVersion)
	return ""
}

// TestExamples runs examples/node and examples/shell, as a user would,
// against a real daemon, Redis and NATS. Each schedules, receives and checks
// a delivery, cancels a second message and waits 3 s for it not to come,
// reads an error reply, and schedules a batch whose bad envelope alone is
// refused; the node one also schedules through the durable intake stream
// with @nats-io/jetstream. Both exit non-zero on any mismatch.
func TestExamples(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	e.StartDaemon(e.Config())
	for _, tc := range []struct {
		name string
		want []string
		cmd  func(t *testing.T) (bin string, args, env []string)
	}{
		{"node", []string{"scheduled: ", "delivered order-", "scheduled: ", "cancelled: ",
			"nothing delivered within 3 s of the cancel", "durable intake: stream DELAYD_INTAKE ",
			"error reply: 400 ", "batch: order-", "delivered order-", "ok"}, func(t *testing.T) (string, []string, []string) {
			return nodeExample(t), []string{"example.mjs"}, []string{"DELAYD_EXAMPLE_PREFIX=examples.node"}
		}},
		{"shell", []string{"scheduled: ", "delivered order-", "scheduled: ", "cancelled: ",
			"nothing delivered within 3 s of the cancel", "error reply: 400 ", "batch: ", "delivered order-45 from the batch", "ok"}, func(t *testing.T) (string, []string, []string) {
			return "bash", []string{"example.sh"}, []string{"PATH=" + natscli(t) + string(os.PathListSeparator) + os.Getenv("PATH")}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bin, args, env := tc.cmd(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, args...)
			cmd.Dir = filepath.Join(examplesDir, tc.name)
			cmd.Env = append(append(os.Environ(), "NATS_URL="+e.NATS.URL()), env...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			start := time.Now()
			if err := cmd.Run(); err != nil {
				t.Fatalf("%s example: %v\nstdout:\n%s\nstderr:\n%s", tc.name, err, stdout.String(), stderr.String())
			}
			t.Logf("%s example took %s:\n%s", tc.name, time.Since(start).Round(time.Millisecond), stdout.String())
			lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
			if len(lines) != len(tc.want) {
				t.Fatalf("%d lines, want %d:\n%s", len(lines), len(tc.want), stdout.String())
			}
			for i, prefix := range tc.want {
				if !strings.HasPrefix(lines[i], prefix) {
					t.Errorf("line %d is %q, want it to start with %q", i+1, lines[i], prefix)
				}
			}
		})
	}
}

// natsCommand matches a nats CLI invocation that sends or receives.
var natsCommand = regexp.MustCompile(`\bnats (sub|subscribe|req|request) `)

// readmeNatsCommands returns every nats sub/req line of the README's sh
// blocks: what a user copies.
func readmeNatsCommands(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var cmds []string
	inSh := false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "```"):
			inSh = !inSh && line == "```sh"
		case inSh && natsCommand.MatchString(line) && strings.HasPrefix(line, "nats "):
			cmds = append(cmds, line)
		}
	}
	return cmds
}

// TestShellExampleMatchesReadme checks that the README's nats commands and
// examples/shell's are the same, character for character: every README
// command is a whole command in the script (only shell plumbing such as
// `$(...)`, `{ ... }` or a redirection around it), and every nats command in
// the script is one of the README's. So what TestExamples runs is what the
// README shows.
func TestShellExampleMatchesReadme(t *testing.T) {
	t.Parallel()
	cmds := readmeNatsCommands(t)
	if len(cmds) < 5 {
		t.Fatalf("README shows %d nats commands, want the schedule, receive, cancel and error steps: %q", len(cmds), cmds)
	}
	b, err := os.ReadFile(filepath.Join(examplesDir, "shell", "example.sh"))
	if err != nil {
		t.Fatal(err)
	}
	var script []string
	for _, line := range strings.Split(string(b), "\n") {
		if natsCommand.MatchString(line) && !strings.HasPrefix(strings.TrimSpace(line), "#") {
			script = append(script, strings.TrimSpace(line))
		}
	}
	// contains reports whether cmd is a whole command in line.
	contains := func(line, cmd string) bool {
		for rest := line; ; {
			i := strings.Index(rest, cmd)
			if i < 0 {
				return false
			}
			before, after := rest[:i], rest[i+len(cmd):]
			if (before == "" || strings.HasSuffix(before, "$(") || strings.HasSuffix(before, "{ ")) &&
				(after == "" || strings.HasPrefix(after, ")") || strings.HasPrefix(after, " }") ||
					strings.HasPrefix(after, " >") || strings.HasPrefix(after, " 2>") || strings.HasPrefix(after, " ||")) {
				return true
			}
			rest = rest[i+1:]
		}
	}
	for _, cmd := range cmds {
		found := false
		for _, line := range script {
			found = found || contains(line, cmd)
		}
		if !found {
			t.Errorf("README command not in examples/shell/example.sh: %s", cmd)
		}
	}
	for _, line := range script {
		found := false
		for _, cmd := range cmds {
			found = found || contains(line, cmd)
		}
		if !found {
			t.Errorf("examples/shell/example.sh runs a nats command the README does not show: %s", line)
		}
	}
}
