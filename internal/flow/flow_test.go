package flow

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
)

// fakeStore is the Gate's Store, in memory: Reserve gives slots from
// next, one per interval, and records the order of the ids it was asked.
type fakeStore struct {
	rules    store.FlowRules
	now      int64
	next     int64
	asked    []string
	parked   map[string][]string
	resumed  []string
	fail     error
	reserved map[string]int64
	// strays are the targets of parked envelopes ReleaseStrays finds;
	// released, those it was told no pause holds.
	strays, released []string
}

func (f *fakeStore) FlowRules(context.Context) (store.FlowRules, error) { return f.rules, f.fail }
func (f *fakeStore) SetLimit(context.Context, store.Limit) error        { return f.fail }
func (f *fakeStore) Reserve(_ context.Context, l store.Limit, ids []string, _ []int64) (int64, []int64, error) {
	if f.fail != nil {
		return 0, nil, f.fail
	}
	slots := make([]int64, len(ids))
	for i, id := range ids {
		f.asked = append(f.asked, id)
		if s, ok := f.reserved[id]; ok {
			slots[i] = s
			continue
		}
		slots[i] = max(f.now, f.next)
		f.next = slots[i] + l.IntervalUs/1000
		f.reserved[id] = slots[i]
	}
	return f.now, slots, nil
}
func (f *fakeStore) Park(_ context.Context, p string, ids []string, _ []int64, _ []string) error {
	if f.fail != nil {
		return f.fail
	}
	f.parked[p] = append(f.parked[p], ids...)
	return nil
}
func (f *fakeStore) ReleaseLeftover(_ context.Context, kind, p string) (int, error) {
	f.resumed = append(f.resumed, kind+" "+p)
	return 3, nil
}
func (f *fakeStore) Held(context.Context, []string) (map[string]store.FlowHeld, error) {
	return nil, nil
}
func (f *fakeStore) ReleaseStrays(_ context.Context, keep func([]byte) bool) (int, error) {
	n := 0
	for _, target := range f.strays {
		if !keep(envelope.Encode(envelope.Envelope{Target: target})) {
			f.released = append(f.released, target)
			n++
		}
	}
	return n, nil
}

func newFake(now int64) *fakeStore {
	return &fakeStore{now: now, parked: map[string][]string{}, reserved: map[string]int64{}, rules: store.FlowRules{Paused: map[string]int64{}}}
}

func delivery(id, target string, due int64) envelope.Delivery {
	return envelope.Delivery{ID: id, Due: time.UnixMilli(due), Envelope: envelope.Envelope{Target: target}}
}

// TestAdmitWithoutRulesCostsNothing: no rule, no decision and no call.
func TestAdmitWithoutRulesCostsNothing(t *testing.T) {
	f := newFake(1000)
	g := NewGate(f, nil, nil, hclog.NewNullLogger())
	if err := g.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := g.Admit(context.Background(), []envelope.Delivery{delivery("a", "x", 1)}); d != nil || len(f.asked) != 0 {
		t.Fatalf("decisions %v, asked %v", d, f.asked)
	}
}

// TestAdmitHoldsByTheMostSpecificLimitInDueOrder: each target obeys the
// most specific limit matching it; slots are asked in due order; a slot
// now goes, a later one holds until it; a pause wins over a limit, and
// unmatched targets go.
func TestAdmitHoldsByTheMostSpecificLimitInDueOrder(t *testing.T) {
	f := newFake(10_000)
	f.rules.Limits = []store.Limit{
		{Pattern: "orders.>", Rate: "1/s", IntervalUs: 1e6, Burst: 1},
		{Pattern: "orders.cancel", Rate: "10/s", IntervalUs: 1e5, Burst: 1},
		{Pattern: "*.cancel", Rate: "1/h", IntervalUs: 3600e6, Burst: 1},
	}
	f.rules.Paused["orders.hold.*"] = 1
	g := NewGate(f, nil, nil, hclog.NewNullLogger())
	if err := g.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	ds := []envelope.Delivery{
		delivery("c3", "orders.cancel", 300), delivery("c1", "orders.cancel", 100), delivery("c2", "orders.cancel", 200),
		delivery("free", "mail.send", 5), delivery("p", "orders.hold.x", 5),
	}
	dec := g.Admit(context.Background(), ds)
	if !slices.Equal(f.asked, []string{"c1", "c2", "c3"}) {
		t.Fatalf("slots asked for %v, want c1, c2, c3 (due order, orders.cancel's limit alone)", f.asked)
	}
	want := map[string]int64{"c1": 0, "c2": 10_100, "c3": 10_200, "free": 0, "p": store.ParkedBase + 5}
	for i, d := range ds {
		if dec[i].HoldUntilMs != want[d.ID] || dec[i].RetryIn != 0 {
			t.Errorf("%s: %+v, want held until %d", d.ID, dec[i], want[d.ID])
		}
	}
	if !dec[1].Go() || dec[1].Allowed.IsZero() {
		t.Errorf("c1 goes at its slot, after its due time: %+v", dec[1])
	}
	if !slices.Equal(f.parked["orders.hold.*"], []string{"p"}) {
		t.Errorf("parked %v", f.parked)
	}
	// Asked again (claimed at their slots), the held ones keep them.
	f.now = 10_200
	dec = g.Admit(context.Background(), ds[:1])
	if !dec[0].Go() {
		t.Errorf("c3 at its slot: %+v", dec[0])
	}
}

// TestAdmitGivesBackWhenTheStateCannotBeRead: a limited or paused target
// whose rule's state cannot be read waits (not an attempt), and is never
// sent over its limit.
func TestAdmitGivesBackWhenTheStateCannotBeRead(t *testing.T) {
	f := newFake(1000)
	f.rules.Limits = []store.Limit{{Pattern: "a.>", Rate: "1/s", IntervalUs: 1e6, Burst: 1}}
	f.rules.Paused["b.>"] = 1
	g := NewGate(f, nil, nil, hclog.NewNullLogger())
	if err := g.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.fail = errors.New("redis down")
	dec := g.Admit(context.Background(), []envelope.Delivery{delivery("x", "a.b", 1), delivery("y", "b.c", 1), delivery("z", "c", 1)})
	if dec[0].RetryIn == 0 || dec[1].RetryIn == 0 || !dec[2].Go() {
		t.Fatalf("decisions %+v", dec)
	}
	// The rules read last stay in force while they cannot be read.
	if err := g.Refresh(context.Background()); err == nil {
		t.Fatal("refresh did not fail")
	}
	if g.rules.Load().empty() {
		t.Fatal("a failed read dropped the rules")
	}
}

// TestRefreshResumesWhatAPauseLeftParked: a parked marker without its
// pause (a resume cut short) is resumed by the next daemon that reads it,
// and the lateness of what it releases counts from the resume.
func TestRefreshResumesWhatAPauseLeftParked(t *testing.T) {
	f := newFake(1000)
	f.rules.Paused["a.>"] = 1
	g := NewGate(f, nil, nil, hclog.NewNullLogger())
	if err := g.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(f.resumed) != 0 {
		t.Fatalf("resumed %v while paused", f.resumed)
	}
	f.rules = store.FlowRules{Paused: map[string]int64{}, Parked: []string{"a.>"}}
	before := time.Now()
	if err := g.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.resumed, []string{"parked a.>"}) {
		t.Fatalf("released %v, want parked a.>", f.resumed)
	}
	dec := g.Admit(context.Background(), []envelope.Delivery{delivery("x", "a.b", 5)})
	if dec != nil {
		t.Fatalf("no rule left, decisions %v", dec)
	}
	if at := g.Resumed(delivery("x", "a.b", 5)); at.Before(before) {
		t.Errorf("lateness counts from %s, want the resume (after %s)", at, before)
	}
}

func TestParseRateAndLimit(t *testing.T) {
	for in, want := range map[string]int64{"500/s": 2000, "30/m": 2e6, "10/h": 360e6, "3/s": 333334, "1000000/s": 1} {
		if got, err := ParseRate(in); err != nil || got != want {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "500", "0/s", "-1/s", "1.5/s", "5/d", "2000000/s", "x/s", "500/ s", "+3/s"} {
		if _, err := ParseRate(bad); !errors.Is(err, ErrBadRule) {
			t.Errorf("ParseRate(%q): %v, want a bad rule", bad, err)
		}
	}
	if p, r, b, err := ParseLimit("orders.> 500/s 50"); err != nil || p != "orders.>" || r != "500/s" || b != 50 {
		t.Errorf("ParseLimit: %q %q %d %v", p, r, b, err)
	}
	if _, _, b, err := ParseLimit("mail.send 14/s"); err != nil || b != 1 {
		t.Errorf("a burst defaults to 1: %d %v", b, err)
	}
	for _, bad := range []string{"orders.>", "orders.> 5/s 0", "orders.> 5/s x", "a..b 5/s", "a 5/s 1 2", strings.Repeat("a", 300) + " 1/s", "caf\xe9.x 1/s"} {
		if _, _, _, err := ParseLimit(bad); err == nil {
			t.Errorf("ParseLimit(%q) accepted", bad)
		}
	}
}

// TestAdmitReadsTheRulesItNeverRead: a daemon's first claims can come
// before Run's first reading: Admit reads them itself, and holds
// everything back (not an attempt) while they cannot be read.
func TestAdmitReadsTheRulesItNeverRead(t *testing.T) {
	f := newFake(1000)
	f.rules.Paused["a.>"] = 1
	g := NewGate(f, nil, nil, hclog.NewNullLogger())
	if !g.Ruled("free.x") {
		t.Fatal("unread rules: every target must wait for Admit")
	}
	dec := g.Admit(context.Background(), []envelope.Delivery{delivery("x", "a.b", 5), delivery("y", "free.x", 5)})
	if dec[0].HoldUntilMs != store.ParkedBase+5 || !dec[1].Go() {
		t.Fatalf("decisions %+v, want x parked and y sent", dec)
	}
	f2 := newFake(1000)
	f2.fail = errors.New("redis down")
	dec = NewGate(f2, nil, nil, hclog.NewNullLogger()).Admit(context.Background(), []envelope.Delivery{delivery("y", "free.x", 5)})
	if dec[0].RetryIn == 0 {
		t.Fatalf("rules never read: %+v, want given back", dec)
	}
}

// TestStraysAreJudgedByThePausesInForce: the sweep for parked envelopes
// no list names releases those no pause holds, keeps the others, and
// does nothing before the rules were read.
func TestStraysAreJudgedByThePausesInForce(t *testing.T) {
	f := newFake(1000)
	f.rules.Paused["a.>"] = 1
	f.strays = []string{"a.b", "c.d"}
	g := NewGate(f, nil, nil, hclog.NewNullLogger())
	g.releaseStrays(context.Background())
	if len(f.released) != 0 {
		t.Fatalf("released %v before the rules were read", f.released)
	}
	if err := g.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	g.releaseStrays(context.Background())
	if !slices.Equal(f.released, []string{"c.d"}) {
		t.Fatalf("released %v, want c.d only", f.released)
	}
}
