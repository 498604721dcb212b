package flow

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// TestRateWithANewlineIsRefusedAndABadRuleStandsAlone (found by review):
// ParseRate trimmed the rate, but SetLimit stored it as given; the store
// refused only a space. A rate of
// "5/s\n" (a JSON body on delayd.admin.limit, the console, a CLI argument)
// is stored, and then FlowRules' Sscanf fails on the newline: every
// daemon's Refresh fails (a daemon started now has no rules at all, so
// pauses and limits are not enforced by it), and limits/stats answer 503.
func TestRateWithANewlineIsRefusedAndABadRuleStandsAlone(t *testing.T) {
	t.Parallel()
	r := testutil.StartRedis(t)
	st := store.New(store.NewClient(store.Options{Addrs: []string{r.Addr}}), "flowrev", 4)
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	if _, err := st.Pause(ctx, "crm.>"); err != nil {
		t.Fatal(err)
	}
	c := NewControl(st, nil, nil)
	c.settle = time.Millisecond
	_, err := c.SetLimit(ctx, "orders.>", "5/s\n", 1)
	t.Logf("SetLimit(\"5/s\\n\") = %v", err)
	if _, err := st.FlowRules(ctx); err != nil {
		t.Errorf("after SetLimit: the fleet's rules cannot be read: %v", err)
	}
	g := NewGate(st, nil, nil, hclog.NewNullLogger())
	if err := g.Refresh(ctx); err != nil {
		t.Errorf("a daemon started now cannot read the rules: %v", err)
	}
	decs := g.Admit(ctx, []envelope.Delivery{delivery("c1", "crm.x", time.Now().UnixMilli())})
	if decs == nil || decs[0].Go() {
		t.Errorf("a daemon started now admits a delivery to crm.x, which is paused (decisions %v)", decs)
	}
}

// TestRateWithASpaceIsABadRule (found by review): " 5/s" passed ParseRate
// (trimmed) but the store refused it with an error that was not
// ErrBadRule: the operator got 503 "store unavailable" for bad input.
func TestRateWithASpaceIsABadRule(t *testing.T) {
	t.Parallel()
	r := testutil.StartRedis(t)
	st := store.New(store.NewClient(store.Options{Addrs: []string{r.Addr}}), "flowrev", 4)
	t.Cleanup(func() { st.Close() })
	c := NewControl(st, nil, nil)
	c.settle = time.Millisecond
	_, err := c.SetLimit(context.Background(), "orders.>", " 5/s", 1)
	if err != nil && !errors.Is(err, ErrBadRule) {
		t.Fatalf("SetLimit(\" 5/s\"): %v: not ErrBadRule, so answered 503 store unavailable", err)
	}
}

// slowResume is the real store, with an operator's pause of "b.>" landing
// while the Refresh's resume of "a.>" runs (a big ledger takes seconds).
type slowResume struct {
	*store.Store
	once bool
}

func (s *slowResume) ReleaseLeftover(ctx context.Context, kind, p string) (int, error) {
	n, err := s.Store.ReleaseLeftover(ctx, kind, p)
	if p == "a.>" && !s.once {
		s.once = true
		_, _ = s.Store.Pause(ctx, "b.>") // the operator: `delayd pause 'b.>'`
	}
	return n, err
}

// TestLeftoverReleaseKeepsANewPause (found by review): Refresh released
// every pattern with a parked marker and no pause, one after the other,
// from one reading of the rules, through store.Resume, which deletes the
// pause first: a pause of a later pattern set meanwhile was deleted. The
// leftover release never deletes a pause, and leaves a pattern paused
// again as it is.
func TestLeftoverReleaseKeepsANewPause(t *testing.T) {
	t.Parallel()
	r := testutil.StartRedis(t)
	st := store.New(store.NewClient(store.Options{Addrs: []string{r.Addr}}), "flowrev", 4)
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	// Both patterns left a parked marker (a resume cut short, or daemons
	// that parked after the resume, as designed).
	for _, p := range []string{"a.>", "b.>"} {
		if err := st.Park(ctx, p, []string{"gone-" + p}, []int64{1}, []string{""}); err != nil {
			t.Fatal(err)
		}
	}
	g := NewGate(&slowResume{Store: st}, nil, nil, hclog.NewNullLogger())
	if err := g.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	rules, err := st.FlowRules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := rules.Paused["b.>"]; !ok {
		t.Fatalf("the operator's pause of b.> is gone: %+v", rules)
	}
}

// TestPatternNotUTF8IsABadRule (found by review): a limit on a pattern
// that is not UTF-8, set by hand in Redis (or through the config before
// CheckPattern refused it), crashed the metrics' reporter of every daemon
// in turn. It is left out of the rules, with the rest standing.
func TestPatternNotUTF8IsABadRule(t *testing.T) {
	t.Parallel()
	r := testutil.StartRedis(t)
	st := store.New(store.NewClient(store.Options{Addrs: []string{r.Addr}}), "flowrev", 4)
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	rc := r.Client()
	defer rc.Close()
	if err := rc.HSet(ctx, "{flowrev:flow}", "limit:\xff.x", "1/s 1000000 1", "limit:ok.x", "1/s 1000000 1").Err(); err != nil {
		t.Fatal(err)
	}
	rules, err := st.FlowRules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rules.Limits) != 1 || rules.Limits[0].Pattern != "ok.x" || len(rules.Bad) != 1 {
		t.Fatalf("rules %+v, want ok.x and one bad field", rules)
	}
	if _, err := NewControl(st, nil, nil).SetLimit(ctx, "caf\xe9.x", "1/s", 1); !errors.Is(err, ErrBadRule) {
		t.Fatalf("SetLimit on a pattern not UTF-8: %v, want a bad rule", err)
	}
}

// TestConfigLimitsHoldFromTheFirstClaim (found by review): the config
// file's limits were written by a component beside the scanner, 2 s each
// in turn, so on a fresh namespace a daemon's first deliveries went out
// unlimited. The Gate now writes them before its first reading of the
// rules, which comes before it lets any delivery go.
func TestConfigLimitsHoldFromTheFirstClaim(t *testing.T) {
	t.Parallel()
	r := testutil.StartRedis(t)
	st := store.New(store.NewClient(store.Options{Addrs: []string{r.Addr}}), "flowstatic", 4)
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	static, err := Limits([]string{"cfg.> 1/h", "other.> 5/s 2"})
	if err != nil {
		t.Fatal(err)
	}
	g := NewGate(st, nil, nil, hclog.NewNullLogger())
	g.WriteFirst(static)
	now := time.Now().UnixMilli()
	decs := g.Admit(ctx, []envelope.Delivery{delivery("a", "cfg.x", now), delivery("b", "cfg.x", now), delivery("c", "cfg.x", now)})
	went := 0
	for _, d := range decs {
		if d.Go() {
			went++
		}
	}
	if went != 1 {
		t.Fatalf("%d of 3 went at 1/h on the first claim (decisions %+v), want 1", went, decs)
	}
	rules, err := st.FlowRules(ctx)
	if err != nil || len(rules.Limits) != 2 {
		t.Fatalf("rules %+v (%v), want both config limits", rules, err)
	}
}
