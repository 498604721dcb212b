package store

import (
	"context"
	"errors"
	"fmt"
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
