package systest

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// docsACL is the Redis ACL line of docs/security.md, read from the file as
// an operator copies it, with its password placeholder replaced.
func docsACL(t *testing.T, password string) []any {
	t.Helper()
	b, err := os.ReadFile("../../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("`(ACL SETUSER delayd [^`]+)`").FindAllStringSubmatch(string(b), -1)
	if len(m) != 1 {
		t.Fatalf("docs/security.md: want one `ACL SETUSER delayd ...` line, found %d", len(m))
	}
	if !strings.Contains(m[0][1], ">PASSWORD") {
		t.Fatalf("docs/security.md: the ACL line has no >PASSWORD placeholder: %s", m[0][1])
	}
	var args []any
	for _, f := range strings.Fields(strings.Replace(m[0][1], ">PASSWORD", ">"+password, 1)) {
		args = append(args, f)
	}
	return args
}

// applyDocsACL creates the ACL user of docs/security.md on r.
func applyDocsACL(t *testing.T, r *testutil.Redis, password string) {
	t.Helper()
	if err := r.Client().Do(context.Background(), docsACL(t, password)...).Err(); err != nil {
		t.Fatalf("the ACL line of docs/security.md: %v", err)
	}
}

// TestEvictionGuardUnderDocsACL: a daemon connected as the ACL user of
// docs/security.md (the line read from the file) stops when the default
// user switches Redis to an evicting policy, as operations.md promises.
// The documented ACL once took INFO away (-@dangerous): the daemon logged
// one NOPERM warning and never noticed the switch.
func TestEvictionGuardUnderDocsACL(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	applyDocsACL(t, e.Redis, "guard-pw")
	c := e.Config()
	c.Redis.Username, c.Redis.Password = "delayd", "guard-pw"
	logs, done, _ := runDaemon(t, c)
	e.WaitService(c.Subject)
	if err := e.Redis.Client().ConfigSet(context.Background(), "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "maxmemory-policy") || !strings.Contains(err.Error(), "allkeys-lru") {
			t.Fatalf("want an error naming maxmemory-policy allkeys-lru, got %v\n%s", err, logs.String())
		}
	case <-time.After(40 * time.Second):
		t.Fatalf("the daemon under the documented ACL kept running on an evicting Redis:\n%s", logs.String())
	}
}

// TestEvictionGuardHiddenPolicy: a Redis that will not tell its policy
// (the documented ACL before INFO was added to it) stops the daemon at
// start, naming redis.eviction_check; with eviction_check: skip it runs,
// says the guard is off, and exports state skipped. Before, it logged one
// NOPERM warning and ran with the guard off.
func TestEvictionGuardHiddenPolicy(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	if err := e.Redis.Client().Do(context.Background(), "ACL", "SETUSER", "delayd", "on", ">pw", "resetkeys", "~{delayd:*",
		"-@all", "+@read", "+@write", "+@scripting", "+@connection", "+time", "-@dangerous", "+script|load", "+script|exists").Err(); err != nil {
		t.Fatal(err)
	}
	c := e.Config()
	c.Redis.Username, c.Redis.Password = "delayd", "pw"
	logs, done, _ := runDaemon(t, c)
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "maxmemory-policy") || !strings.Contains(err.Error(), "redis.eviction_check: skip") {
			t.Fatalf("want a refusal naming maxmemory-policy and redis.eviction_check: skip, got %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the daemon started on a Redis that hides its policy:\n%s", logs.String())
	}

	c.Redis.EvictionCheck = "skip"
	logs, done, cancel := runDaemon(t, c)
	e.WaitService(c.Subject)
	if !strings.Contains(logs.String(), "THE EVICTION GUARD IS OFF") {
		t.Errorf("eviction_check: skip on a hidden policy without a loud warning:\n%s", logs.String())
	}
	m := scrape(t, c.HTTP.Addr)
	if m[`delayd_redis_eviction_guard{state="skipped"}`] != 1 || m[`delayd_redis_eviction_guard{state="on"}`] != 0 {
		t.Errorf("want delayd_redis_eviction_guard state skipped, got %v", guardStates(m))
	}
	cancel()
	<-done

	// Under the documented ACL the guard is on.
	e2 := daemontest.NewEnv(t)
	applyDocsACL(t, e2.Redis, "pw")
	c2 := e2.Config()
	c2.Redis.Username, c2.Redis.Password = "delayd", "pw"
	_, done, cancel = runDaemon(t, c2)
	e2.WaitService(c2.Subject)
	if m := scrape(t, c2.HTTP.Addr); m[`delayd_redis_eviction_guard{state="on"}`] != 1 {
		t.Errorf("want delayd_redis_eviction_guard state on under the documented ACL, got %v", guardStates(m))
	}
	cancel()
	<-done
}

func guardStates(m map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if strings.HasPrefix(k, "delayd_redis_eviction_guard") {
			out[k] = v
		}
	}
	return out
}

// TestPersistenceReportUnderDocsACL: under the ACL of docs/security.md
// CONFIG GET is refused, so appendfsync and the save rules cannot be read.
// The start log once showed them empty, which read as "none": save="" and
// a loss window of "everything: no AOF and no RDB snapshots" on a Redis
// with `save 3600 1`, and "appendfsync , typically up to 30 s" with AOF
// on. What cannot be read is said to be unknown, and what INFO tells
// (AOF on or off, the snapshots made) is used.
func TestPersistenceReportUnderDocsACL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		args      []string
		want      []string
		forbidden []string
	}{
		{name: "RDB snapshots", args: []string{"--save", "3600 1"},
			want:      []string{`save="unknown (CONFIG GET refused)"`, "appendonly=no", "since the last RDB snapshot"},
			forbidden: []string{`save=""`, "no AOF and no RDB snapshots"}},
		{name: "AOF", args: []string{"--appendonly", "yes"},
			want:      []string{`appendfsync="unknown (CONFIG GET refused)"`, "appendonly=yes"},
			forbidden: []string{`appendfsync=""`, "appendfsync ,", "no AOF"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := daemontest.NewEnv(t, tc.args...)
			applyDocsACL(t, e.Redis, "report-pw")
			c := e.Config()
			c.Redis.Username, c.Redis.Password = "delayd", "report-pw"
			logs, _, _ := runDaemon(t, c)
			e.WaitService(c.Subject)
			var line string
			for deadline := time.Now().Add(10 * time.Second); line == ""; time.Sleep(20 * time.Millisecond) {
				for _, l := range strings.Split(logs.String(), "\n") {
					if strings.Contains(l, "Redis persistence") {
						line = l
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("no persistence report in the log:\n%s", logs.String())
				}
			}
			for _, w := range tc.want {
				if !strings.Contains(line, w) {
					t.Errorf("the report does not say %s:\n%s", w, line)
				}
			}
			for _, f := range tc.forbidden {
				if strings.Contains(line, f) {
					t.Errorf("the report says %s:\n%s", f, line)
				}
			}
		})
	}
}
