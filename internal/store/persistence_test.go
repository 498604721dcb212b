package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/testutil"
)

// lockedBuffer is a log sink safe for go-redis's connection goroutines.
type lockedBuffer = testutil.Buffer

// TestGuardQuietUnderSentinel: through Sentinel the guard reads the
// master's policy, and says nothing about the sentinel's own connections.
// go-redis runs the OnConnect hook on those too; the sentinel has no
// maxmemory-policy, and every start logged "cannot read Redis persistence
// settings", a false warning that teaches operators to ignore the real one.
func TestGuardQuietUnderSentinel(t *testing.T) {
	t.Parallel()
	sn := testutil.StartSentinel(t)
	var logs lockedBuffer
	g := NewGuard(GuardOptions{}, hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Debug}))
	c := NewClient(Options{Addrs: []string{sn.Addr}, MasterName: "mymaster", OnConnect: g.OnConnect})
	defer c.Close()
	ctx := context.Background()
	if err := g.Check(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "{t:x", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if strings.Contains(out, "cannot read") || strings.Contains(out, "WARN") {
		t.Errorf("a warning under Sentinel:\n%s", out)
	}
	if !strings.Contains(out, "maxmemory-policy=noeviction") {
		t.Errorf("the master's policy is not logged:\n%s", out)
	}
}

// TestGuardHiddenPolicy: a Redis that will not tell its policy (INFO and
// CONFIG refused to the ACL user) stops the guard unless the operator
// said it was checked; then the guard says it is off, once, and its state
// is skipped. A policy it can read is still enforced when skipping.
func TestGuardHiddenPolicy(t *testing.T) {
	t.Parallel()
	r := testutil.StartRedis(t)
	ctx := context.Background()
	// The ACL of docs/security.md before INFO was added to it.
	if err := r.Client().Do(ctx, "ACL", "SETUSER", "blind", "on", ">pw", "resetkeys", "~{t:*", "-@all", "+@read", "+@write",
		"+@scripting", "+@connection", "+time", "-@dangerous").Err(); err != nil {
		t.Fatal(err)
	}
	blind := NewClient(Options{Addrs: []string{r.Addr}, Username: "blind", Password: "pw"})
	defer blind.Close()
	admin := r.Client()

	var logs lockedBuffer
	log := hclog.New(&hclog.LoggerOptions{Output: &logs})
	g := NewGuard(GuardOptions{}, log)
	if g.State() != GuardUnknown {
		t.Errorf("state %s before the first check, want unknown", g.State())
	}
	err := g.Check(ctx, blind)
	if !errors.Is(err, ErrPolicyHidden) || !strings.Contains(err.Error(), "NOPERM") || !strings.Contains(err.Error(), "redis.eviction_check: skip") {
		t.Fatalf("want ErrPolicyHidden naming NOPERM and redis.eviction_check: skip, got %v", err)
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := g.Run(rctx, blind); !errors.Is(err, ErrPolicyHidden) {
		t.Fatalf("Run returned %v, want the hidden policy", err)
	}

	g = NewGuard(GuardOptions{SkipHidden: true}, log)
	for range 3 {
		if err := g.Check(ctx, blind); err != nil {
			t.Fatalf("skip: %v", err)
		}
	}
	if g.State() != GuardSkipped {
		t.Errorf("state %s, want skipped", g.State())
	}
	if n := strings.Count(logs.String(), "THE EVICTION GUARD IS OFF"); n != 1 {
		t.Errorf("the guard said it is off %d times, want once:\n%s", n, logs.String())
	}
	// Readable again (INFO granted), noeviction: on.
	if err := admin.Do(ctx, "ACL", "SETUSER", "blind", "+info").Err(); err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx, blind); err != nil || g.State() != GuardOn {
		t.Fatalf("readable noeviction: %v, state %s", err, g.State())
	}
	// Skipping the unreadable case does not accept an evicting policy.
	if err := admin.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx, blind); err == nil || !strings.Contains(err.Error(), "allkeys-lru") {
		t.Fatalf("evicting policy with eviction_check skip: %v", err)
	}
	a := NewGuard(GuardOptions{AllowEviction: true}, log)
	if err := a.Check(ctx, blind); err != nil || a.State() != GuardAllowed {
		t.Fatalf("allowed eviction: %v, state %s", err, a.State())
	}
}

// TestGuardUnreachableIsNotHidden: a Redis that cannot be asked (down) is
// no refusal: the guard stays unknown and waits for a connection.
func TestGuardUnreachableIsNotHidden(t *testing.T) {
	t.Parallel()
	c := NewClient(Options{Addrs: []string{fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))}})
	defer c.Close()
	g := NewGuard(GuardOptions{}, hclog.NewNullLogger())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := g.Check(ctx, c); err != nil || g.State() != GuardUnknown {
		t.Fatalf("unreachable Redis: %v, state %s; want no error, unknown", err, g.State())
	}
}

// TestGuardRenamedCommands: a managed Redis that renamed INFO and CONFIG
// away hides its policy too.
func TestGuardRenamedCommands(t *testing.T) {
	t.Parallel()
	r := testutil.StartRedis(t, "--rename-command", "INFO", "", "--rename-command", "CONFIG", "")
	c := NewClient(Options{Addrs: []string{r.Addr}})
	defer c.Close()
	err := NewGuard(GuardOptions{}, hclog.NewNullLogger()).Check(context.Background(), c)
	if !errors.Is(err, ErrPolicyHidden) || !strings.Contains(err.Error(), "unknown command") {
		t.Fatalf("want ErrPolicyHidden naming the unknown command, got %v", err)
	}
}

// TestLossWindowUnknown: a setting CONFIG GET would not give is unknown,
// never read as "none" (no snapshot rules, or an empty appendfsync).
func TestLossWindowUnknown(t *testing.T) {
	hidden := unknown("CONFIG GET refused")
	for _, tc := range []struct {
		p         Persistence
		want, not string
	}{
		{Persistence{AppendOnly: "no", Save: hidden}, "unknown: no AOF, save rules unknown (CONFIG GET refused)", "everything: no AOF and no RDB"},
		{Persistence{AppendOnly: "no", Save: hidden, Snapshots: true}, "every write since the last RDB snapshot (save rules unknown", "everything"},
		{Persistence{AppendOnly: "yes", AppendFsync: hidden, Save: hidden}, "unknown: AOF is on, appendfsync unknown (CONFIG GET refused)", "appendfsync ,"},
		{Persistence{AppendOnly: "no", Save: ""}, "everything: no AOF and no RDB snapshots", "unknown"},
		{Persistence{AppendOnly: "no", Save: "3600 1"}, "every write since the last RDB snapshot (save 3600 1)", "unknown"},
	} {
		got := tc.p.LossWindow()
		if !strings.Contains(got, tc.want) || strings.Contains(got, tc.not) {
			t.Errorf("%+v: %q, want %q and not %q", tc.p, got, tc.want, tc.not)
		}
	}
}

// evictingPolicies are Redis's maxmemory-policy values other than
// noeviction: each may delete keys on its own, acknowledged envelopes
// among them (the volatile ones too: delayd sets TTLs on some keys).
var evictingPolicies = []string{"allkeys-lru", "allkeys-lfu", "allkeys-random",
	"volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"}

// TestGuardClassifiesEachPolicy: on a live Redis, each maxmemory-policy
// value is read and classified: noeviction is on; every other stops the
// guard with an error naming it (Run returns it at once), and with
// redis.allow_eviction is allowed with one loud warning naming it.
// redis.eviction_check: skip, which only accepts a policy Redis will not
// tell, does not accept one.
func TestGuardClassifiesEachPolicy(t *testing.T) {
	t.Parallel()
	r := testutil.StartRedis(t)
	c := NewClient(Options{Addrs: []string{r.Addr}})
	defer c.Close()
	ctx := context.Background()
	for _, policy := range append([]string{"noeviction"}, evictingPolicies...) {
		if err := r.Client().ConfigSet(ctx, "maxmemory-policy", policy).Err(); err != nil {
			t.Fatalf("%s: %v", policy, err)
		}
		p, err := ReadPersistence(ctx, c)
		if err != nil || p.EvictionPolicy != policy || p.Evicts() != (policy != "noeviction") {
			t.Errorf("%s: read %+v (evicts %v), %v", policy, p, p.Evicts(), err)
		}
		for _, opt := range []GuardOptions{{}, {SkipHidden: true}} {
			g := NewGuard(opt, hclog.NewNullLogger())
			err := g.Check(ctx, c)
			if policy == "noeviction" {
				if err != nil || g.State() != GuardOn {
					t.Errorf("%s %+v: %v, state %s; want on", policy, opt, err, g.State())
				}
				continue
			}
			if err == nil || !strings.Contains(err.Error(), `"`+policy+`"`) || !strings.Contains(err.Error(), "redis.allow_eviction") {
				t.Errorf("%s %+v: %v, want an error naming it and redis.allow_eviction", policy, opt, err)
			}
			if g.State() != GuardUnknown {
				t.Errorf("%s %+v: state %s, want unknown (never on)", policy, opt, g.State())
			}
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if rerr := g.Run(rctx, c); rerr == nil || rerr.Error() != err.Error() {
				t.Errorf("%s %+v: Run returned %v, want the finding at once", policy, opt, rerr)
			}
			cancel()
		}
		var logs lockedBuffer
		g := NewGuard(GuardOptions{AllowEviction: true}, hclog.New(&hclog.LoggerOptions{Output: &logs}))
		for range 2 {
			if err := g.Check(ctx, c); err != nil {
				t.Errorf("%s allowed: %v", policy, err)
			}
		}
		want := map[bool]string{true: GuardOn, false: GuardAllowed}[policy == "noeviction"]
		if g.State() != want {
			t.Errorf("%s allowed: state %s, want %s", policy, g.State(), want)
		}
		warned := strings.Count(logs.String(), "REDIS MAY EVICT KEYS: maxmemory-policy is "+policy+";")
		if policy != "noeviction" && warned != 1 || policy == "noeviction" && strings.Contains(logs.String(), "MAY EVICT") {
			t.Errorf("%s allowed: warned %d times:\n%s", policy, warned, logs.String())
		}
	}
	// A policy a later Redis may add is taken as evicting: only
	// noeviction is known to keep every key.
	if !(Persistence{EvictionPolicy: "allkeys-new"}).Evicts() {
		t.Error("an unknown policy is taken for one that keeps every key")
	}
}

// docsACL is the Redis ACL line of docs/security.md, as an operator copies
// it, with its password placeholder replaced.
func docsACL(t *testing.T, password string) []any {
	t.Helper()
	b, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("`(ACL SETUSER delayd [^`]+)`").FindAllStringSubmatch(string(b), -1)
	if len(m) != 1 || !strings.Contains(m[0][1], ">PASSWORD") {
		t.Fatalf("docs/security.md: want one `ACL SETUSER delayd ... >PASSWORD ...` line, found %q", m)
	}
	var args []any
	for _, f := range strings.Fields(strings.Replace(m[0][1], ">PASSWORD", ">"+password, 1)) {
		args = append(args, f)
	}
	return args
}

// TestGuardUnderDocsACL: as the ACL user of docs/security.md (the line
// read from the file), which refuses CONFIG GET but grants INFO, the guard
// reads the policy from INFO and is on; the periodic re-check finds a
// policy switched to evicting on the live Redis (no new connection) and
// Run stops with it. The documented ACL once took INFO away: the daemon
// logged one NOPERM warning and never noticed the switch. Without its
// +info the line hides the policy.
//
// What CONFIG GET alone tells (appendfsync, the save rules) is reported
// unknown, never empty: the start log once said save="" and a loss window
// of "everything: no AOF and no RDB snapshots" on a Redis with
// `save 3600 1`, and "appendfsync , typically up to 30 s" with AOF on.
func TestGuardUnderDocsACL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		args      []string
		want      []string
		forbidden []string
	}{
		{name: "RDB snapshots", args: []string{"--save", "3600 1"},
			want:      []string{"maxmemory-policy=noeviction", `save="unknown (CONFIG GET refused)"`, "appendonly=no", "since the last RDB snapshot"},
			forbidden: []string{`save=""`, "no AOF and no RDB snapshots"}},
		{name: "AOF", args: []string{"--appendonly", "yes"},
			want:      []string{"maxmemory-policy=noeviction", `appendfsync="unknown (CONFIG GET refused)"`, "appendonly=yes"},
			forbidden: []string{`appendfsync=""`, "appendfsync ,", "no AOF"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := testutil.StartRedis(t, tc.args...)
			ctx := context.Background()
			admin := r.Client()
			if err := admin.Do(ctx, docsACL(t, "pw")...).Err(); err != nil {
				t.Fatalf("the ACL line of docs/security.md: %v", err)
			}
			c := NewClient(Options{Addrs: []string{r.Addr}, Username: "delayd", Password: "pw"})
			defer c.Close()
			if err := c.ConfigGet(ctx, "save").Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
				t.Fatalf("CONFIG GET under the documented ACL: %v, want NOPERM", err)
			}

			var logs lockedBuffer
			g := NewGuard(GuardOptions{}, hclog.New(&hclog.LoggerOptions{Output: &logs}))
			if err := g.Check(ctx, c); err != nil || g.State() != GuardOn {
				t.Fatalf("under the documented ACL: %v, state %s; want on", err, g.State())
			}
			line := logs.String()
			if !strings.Contains(line, "Redis persistence") {
				t.Fatalf("no persistence report in the log:\n%s", line)
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
			if strings.Contains(line, "WARN") {
				t.Errorf("a warning under the documented ACL:\n%s", line)
			}
			if tc.name != "AOF" {
				return // one live switch is enough: it waits for a re-check
			}
			done := make(chan error, 1)
			go func() { done <- g.Run(ctx, c) }()
			if err := admin.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), "allkeys-lru") {
					t.Fatalf("Run returned %v, want the evicting policy", err)
				}
			case <-time.After(guardEvery + 10*time.Second):
				t.Fatalf("Run did not find the switch to allkeys-lru within %s", guardEvery+10*time.Second)
			}

			// The line without +info: the policy is hidden.
			var noInfo []any
			for _, a := range docsACL(t, "pw2") {
				if a != "+info" {
					noInfo = append(noInfo, a)
				}
			}
			noInfo[2] = "blind"
			if err := admin.Do(ctx, noInfo...).Err(); err != nil {
				t.Fatal(err)
			}
			blind := NewClient(Options{Addrs: []string{r.Addr}, Username: "blind", Password: "pw2"})
			defer blind.Close()
			if _, err := ReadPersistence(ctx, blind); !errors.Is(err, ErrPolicyHidden) {
				t.Errorf("the documented line without +info: %v, want the policy hidden", err)
			}
		})
	}
}
