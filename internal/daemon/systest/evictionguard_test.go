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
