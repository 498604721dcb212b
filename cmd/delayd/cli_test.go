package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// cliRunner runs delayd commands against a test daemon's NATS.
func cliRunner(e *daemontest.Env) func(args ...string) (string, error) {
	getenv := func(k string) string {
		if k == "DELAYD_NATS_URL" {
			return e.NATS.URL()
		}
		return ""
	}
	return func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{"delayd"}, args...), getenv, &out, &errOut)
		return out.String() + errOut.String(), err
	}
}

// TestCLIBehaves covers the command line against a real daemon: flags
// after arguments, exit codes, and list in due order a page at a time.
func TestCLIBehaves(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	e.StartDaemon(c)
	cli := cliRunner(e)
	// Due times whose order differs from both id order and shard order;
	// whole seconds, so the service prints them without a fraction.
	base := time.Now().Add(time.Hour).Truncate(time.Second).UTC()
	var want []string
	for i := range 12 {
		id := fmt.Sprintf("order-%02d", i)
		at := base.Add(time.Duration((i*7)%12) * time.Second)
		if _, err := cli("schedule", "--target", "orders.cancel", "--at", at.Format(time.RFC3339Nano), "--id", id, "x"); err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	slices.SortFunc(want, func(a, b string) int {
		var i, j int
		fmt.Sscanf(a, "order-%d", &i)
		fmt.Sscanf(b, "order-%d", &j)
		return (i*7)%12 - (j*7)%12
	})

	// Flags after the argument.
	out, err := cli("get", "order-03", "--json")
	var info client.Entry
	if err != nil || json.Unmarshal([]byte(out), &info) != nil || info.ID != "order-03" {
		t.Fatalf("get ID --json: %v\n%s", err, out)
	}

	// A missing id fails the same way for cancel as for get.
	for _, cmd := range []string{"get", "cancel"} {
		if _, err := cli(cmd, "nope"); exitCode(err, io.Discard) != 1 {
			t.Errorf("%s nope: exit %d (%v), want 1", cmd, exitCode(err, io.Discard), err)
		}
	}
	if out, err := cli("cancel", "order-11"); err != nil || !strings.Contains(out, `"cancelled":true`) {
		t.Errorf("cancel of a stored id: %v %s", err, out)
	}
	want = slices.DeleteFunc(want, func(id string) bool { return id == "order-11" })

	// The table pages in due order across shards, times in one width; the
	// last page has no cursor.
	row := regexp.MustCompile(`^(order-\d\d)\s+(\S+)\s`)
	var got []string
	cursor := ""
	for pages := 0; ; pages++ {
		args := []string{"list", "--limit", "4"}
		if cursor != "" {
			args = append(args, "--cursor", cursor)
		}
		out, err := cli(args...)
		if err != nil {
			t.Fatalf("list: %v\n%s", err, out)
		}
		cursor = ""
		for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
			if c, ok := strings.CutPrefix(line, "more: --cursor "); ok {
				cursor = c
				continue
			}
			m := row.FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("list row %q", line)
			}
			got = append(got, m[1])
			if len(m[2]) != len("2006-01-02T15:04:05.000Z") {
				t.Errorf("due %q is not fixed width", m[2])
			}
		}
		if cursor == "" {
			break
		}
		if pages > 5 {
			t.Fatalf("paging does not end: %v", got)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("list order\n got %v\nwant %v (by due time)", got, want)
	}
	// 11 entries, pages of 4, 4, 3: the third is the last, and a page of
	// exactly the rest is the last too.
	if out, err := cli("list", "--limit", "11"); err != nil || strings.Contains(out, "more:") {
		t.Errorf("a page holding every entry offers more: %v\n%s", err, out)
	}
	if _, err := cli("list", "--limit", "5000"); exitCode(err, io.Discard) != 2 {
		t.Errorf("list --limit 5000: %v, want a usage error", err)
	}
	// The service refuses it too, rather than clamping it silently.
	nc := e.Conn()
	defer nc.Close()
	var se *client.ServiceError
	if _, err := client.New(nc).List(context.Background(), client.ListRequest{Limit: 5000}); !errors.As(err, &se) || se.Code != 400 {
		t.Errorf("admin.list with limit 5000: %v, want a 400", err)
	}
}

// Each command shows its own flags; client commands do not list the
// daemon's; every command has --help; completion scripts come with it.
func TestCLIHelpAndCompletion(t *testing.T) {
	t.Parallel()
	noenv := func(string) string { return "" }
	help := func(args ...string) string {
		var out bytes.Buffer
		if err := run(context.Background(), append([]string{"delayd"}, args...), noenv, &out, &out); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return out.String()
	}
	for _, cmd := range []string{"schedule", "cancel", "get", "list", "stats", "dead list", "dead replay", "dead purge", "healthcheck"} {
		out := help(append(strings.Fields(cmd), "--help")...)
		for _, daemonOnly := range []string{"--embedded", "--log-json", "--cpuprofile", "--redis-addrs", "--log-level"} {
			if strings.Contains(out, daemonOnly) {
				t.Errorf("%s --help lists %s", cmd, daemonOnly)
			}
		}
	}
	if out := help("run", "--help"); !strings.Contains(out, "--embedded") || !strings.Contains(out, "--redis-addrs") {
		t.Errorf("run --help lacks its flags:\n%s", out)
	}
	for _, cmd := range []string{"doctor", "bench", "config", "version", "dead"} {
		help(cmd, "--help")
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		if out := help("completion", shell); !strings.Contains(out, "delayd") {
			t.Errorf("completion %s: %q", shell, out)
		}
	}
	var errOut bytes.Buffer
	for _, args := range [][]string{{"help", "bogus"}, {"dead"}, {"dead", "bogus"}, {"get"}, {"list", "extra"}} {
		err := run(context.Background(), append([]string{"delayd"}, args...), noenv, io.Discard, &errOut)
		if got := exitCode(err, &errOut); got != 2 {
			t.Errorf("%v: exit %d (%v), want 2", args, got, err)
		}
	}
}

// The environment is checked through run: a mistyped DELAYD_ variable
// stops the command and names the nearest known one, and an empty
// DELAYD_HTTP_ADDR turns the admin server off.
func TestCLIStrictEnv(t *testing.T) {
	t.Setenv("DELAYD_REDIS_ADDR", "redis:6379")
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"delayd", "config"}, os.Getenv, &out, &errOut)
	if exitCode(err, &errOut) != 1 || !strings.Contains(errOut.String(), "did you mean DELAYD_REDIS_ADDRS?") {
		t.Fatalf("mistyped variable: %v\n%s", err, errOut.String())
	}
	os.Unsetenv("DELAYD_REDIS_ADDR")
	t.Setenv("DELAYD_HTTP_ADDR", "")
	t.Setenv("DELAYD_SCANNER_LEASE", "5s")
	out.Reset()
	if err := run(context.Background(), []string{"delayd", "config"}, os.Getenv, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "addr: \"\"") || !strings.Contains(out.String(), "lease: 5s") {
		t.Errorf("config with DELAYD_HTTP_ADDR= and DELAYD_SCANNER_LEASE=5s:\n%s", out.String())
	}
	t.Setenv("DELAYD_SCANNER_LEASE", "5")
	err = run(context.Background(), []string{"delayd", "config"}, os.Getenv, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "DELAYD_SCANNER_LEASE") || !strings.Contains(err.Error(), "5s") {
		t.Errorf("DELAYD_SCANNER_LEASE=5: %v", err)
	}
}

// TestCLIScheduleRepeatFlags: the repeat flags reach the request as the
// client's headers, and a mistake in them is a usage error. A responder
// on the real nats-server stands in for the daemon, which refuses repeats
// until it knows them.
func TestCLIScheduleRepeatFlags(t *testing.T) {
	t.Parallel()
	n := testutil.StartNATS(t)
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	got := make(chan nats.Header, 10)
	if _, err := nc.Subscribe("delayd.schedule", func(m *nats.Msg) {
		got <- m.Header
		_ = m.Respond([]byte(`{"id":"r-1","deliver_at":"2026-12-01T09:00:00Z"}`))
	}); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	getenv := func(k string) string {
		if k == "DELAYD_NATS_URL" {
			return n.URL()
		}
		return ""
	}
	for _, tc := range []struct {
		args []string
		want map[string]string
	}{
		{[]string{"--every", "90m", "--start", "2026-12-01T09:00:00+01:00", "--until", "2026-12-31T00:00:00Z", "--count", "3", "--catch-up", "all"},
			map[string]string{"Delayd-Every": "1h30m0s", "Delayd-Start": "2026-12-01T08:00:00Z", "Delayd-Until": "2026-12-31T00:00:00Z",
				"Delayd-Count": "3", "Delayd-Catch-Up": "all"}},
		{[]string{"--cron", "0 9 * * MON-FRI", "--tz", "Europe/Paris", "--id", "r-1"},
			map[string]string{"Delayd-Cron": "0 9 * * MON-FRI", "Delayd-Time-Zone": "Europe/Paris", "Delayd-Id": "r-1"}},
		{[]string{"--delay", "30m", "--jitter", "2s"}, map[string]string{"Delayd-Delay": "30m0s", "Delayd-Jitter": "2s"}},
	} {
		var out, errOut bytes.Buffer
		args := append(append([]string{"delayd", "schedule", "--target", "reports.daily"}, tc.args...), "x")
		if err := run(context.Background(), args, getenv, &out, &errOut); err != nil || out.String() != `{"id":"r-1","deliver_at":"2026-12-01T09:00:00Z"}`+"\n" {
			t.Fatalf("%v: %v %q %s", tc.args, err, out.String(), errOut.String())
		}
		h := <-got
		for k, v := range tc.want {
			if h.Get(k) != v {
				t.Errorf("%v: %s = %q, want %q", tc.args, k, h.Get(k), v)
			}
		}
	}
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"--every", "1h", "--delay", "1s"}, 2},
		{[]string{"--every", "often"}, 2},
		{[]string{"--cron", "* * * * *", "--start", "tomorrow"}, 2},
		{[]string{"--every", "1h", "--catch-up", "some"}, 2},
		{[]string{"--delay", "1s", "--jitter", "soon"}, 2},
		{[]string{"--delay", "1s", "--count", "2"}, 1}, // the client's check: a bad request
	} {
		var out, errOut bytes.Buffer
		args := append(append([]string{"delayd", "schedule", "--target", "reports.daily"}, tc.args...), "x")
		if code := exitCode(run(context.Background(), args, getenv, &out, &errOut), &errOut); code != tc.code {
			t.Errorf("%v: exit %d, want %d: %s", tc.args, code, tc.code, errOut.String())
		}
	}
	if len(got) != 0 {
		t.Errorf("%d refused schedules were sent", len(got))
	}
}

// A single-value flag given twice is a usage mistake (exit 2) naming the
// flag, not a silent last-wins; a list flag may repeat.
func TestCLIRepeatedFlagIsAUsageError(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"schedule", "--target", "a.b", "--delay", "1s", "--delay", "2s", "x"},
		{"schedule", "--target", "a.b", "--target", "c.d", "--delay", "1s", "x"},
		{"cancel", "--nats-url", "nats://127.0.0.1:1", "--nats-url", "nats://127.0.0.1:2", "id"},
		{"run", "--embedded", "--embedded"},
	} {
		var out bytes.Buffer
		err := run(context.Background(), append([]string{"delayd"}, args...), func(string) string { return "" }, &out, &out)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "duplicate") {
			t.Errorf("%v: want a usage error about the duplicate flag, got %v", args, err)
		}
	}
}

// delayd version names the version and the Go toolchain from the build
// info (and the commit when the binary was built from a checkout).
func TestVersionFromBuildInfo(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"delayd", "version"}, func(string) string { return "" }, &out, &out); err != nil {
		t.Fatal(err)
	}
	if line := strings.TrimSpace(out.String()); !strings.HasPrefix(line, "delayd ") || !strings.HasSuffix(line, runtime.Version()) {
		t.Fatalf("version: %q, want delayd <version> [commit <sha>] %s", line, runtime.Version())
	}
}

// With log.json a daemon's fatal error is a JSON line too, and main prints
// nothing else: every line of its output parses.
func TestFatalErrorIsJSONWithLogJSON(t *testing.T) {
	t.Parallel()
	n := testutil.StartNATS(t) // holds the port the embedded server wants
	var out bytes.Buffer
	err := run(context.Background(), []string{"delayd", "run", "--embedded", "--log-json", "--nats-url", n.URL(),
		"--set", "http.addr=127.0.0.1:0", "--set", "ui.enabled=false"}, func(string) string { return "" }, &out, &out)
	if err == nil {
		t.Fatal("the daemon started on a port another server holds")
	}
	exitCode(err, &out)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	for _, l := range lines {
		var v map[string]any
		if json.Unmarshal([]byte(l), &v) != nil {
			t.Fatalf("not a JSON line: %q\nall output:\n%s", l, out.String())
		}
	}
	if last := lines[len(lines)-1]; !strings.Contains(last, `"@level":"error"`) || !strings.Contains(last, "delayd stopped") {
		t.Fatalf("last line %q: want the fatal error as a JSON error line", last)
	}
}

// TestDeadActUnknownID: dead replay and dead purge of an id that is not
// dead fail with "not found" and exit 1, as get and cancel of an unknown
// id do, instead of reporting 0 envelopes and exiting 0.
func TestDeadActUnknownID(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	e.StartDaemon(e.Config())
	cli := cliRunner(e)
	for _, verb := range []string{"replay", "purge"} {
		out, err := cli("dead", verb, "no-such-id")
		var buf bytes.Buffer
		if code := exitCode(err, &buf); code != 1 || !strings.Contains(buf.String(), "not found") || !strings.Contains(buf.String(), "no-such-id") {
			t.Errorf("dead %s no-such-id: exit %d, %q\n%s; want exit 1 saying no-such-id was not found", verb, code, buf.String(), out)
		}
	}
}

// TestTakenPortNamesItsKey: a daemon whose probe or console port another
// process holds stops with an error naming the config key to change, not
// a bare "address already in use".
func TestTakenPortNamesItsKey(t *testing.T) {
	t.Parallel()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	for _, tc := range []struct{ key, other string }{
		{"http.addr", "ui.addr=127.0.0.1:0"},
		{"ui.addr", "http.addr=127.0.0.1:0"},
	} {
		url := fmt.Sprintf("nats://127.0.0.1:%d", testutil.FreePort(t))
		var out bytes.Buffer
		err := run(context.Background(), []string{"delayd", "run", "--embedded", "--nats-url", url,
			"--set", tc.key + "=" + held.Addr().String(), "--set", tc.other}, func(string) string { return "" }, &out, &out)
		if err == nil {
			t.Fatalf("%s: the daemon started on a port another process holds", tc.key)
		}
		if !strings.Contains(out.String()+err.Error(), tc.key+" "+held.Addr().String()) {
			t.Errorf("%s taken: the error does not name %s:\n%v\n%s", tc.key, tc.key, err, out.String())
		}
	}
}

// TestConfigRefusalIsJSONWithLogJSON: a configuration the daemon refuses
// is reported as a JSON log line when log.json was asked for, from the
// flag, the environment or the file, so a log pipeline parses it too.
func TestConfigRefusalIsJSONWithLogJSON(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "delayd.yaml")
	if err := os.WriteFile(file, []byte("log:\n  json: true\nshards: 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"flag", []string{"--log-json", "--set", "shards=0"}, nil},
		{"env", []string{"--set", "shards=0"}, map[string]string{"DELAYD_LOG_JSON": "true"}},
		{"file", []string{"--config", file}, nil},
	} {
		var out bytes.Buffer
		err := run(context.Background(), append([]string{"delayd", "run"}, tc.args...), func(k string) string { return tc.env[k] }, &out, &out)
		code := exitCode(err, &out)
		if code != 1 {
			t.Errorf("%s: exit %d, want 1", tc.name, code)
		}
		for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var v map[string]any
			if json.Unmarshal([]byte(l), &v) != nil {
				t.Errorf("%s: not a JSON line: %q\nall output:\n%s", tc.name, l, out.String())
				break
			}
			if !strings.Contains(l, "shards") {
				t.Errorf("%s: the refusal does not name the key: %s", tc.name, l)
			}
		}
	}
}
