package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testutil"
)

// keyNames are the shard keys in KEYS order (keys.go, list).
var keyNames = []string{"due", "inflight", "data", "attempts", "dead", "errors", "lease", "seen", "done"}

// wrongTypeCase is one script operation as the test runs it: prepare (may
// be nil) runs before the key is broken, run is the call under test, on
// shard sh where the operation takes one shard.
type wrongTypeCase struct {
	name string
	// touches are the keys the call reads or writes: a wrong type in any
	// of them must fail it. Any other key it must not touch at all.
	touches []string
	// oneShard: the call touches shard sh only (the other shard's keys are
	// not tried).
	oneShard bool
	// callPerShard: the operation runs one call per shard (all but
	// schedule on a single Redis), each failing alone: only the broken
	// shard's keys must stay as they were.
	callPerShard bool
	prepare      func(t *testing.T, f *wrongTypeFixture)
	run          func(f *wrongTypeFixture, sh int) error
}

// wrongTypeFixture is a namespace of two shards with envelopes in every
// place a script reads: in the due set, an expired lease, a series, a dead envelope with its error and
// attempts, a tombstone and a remembered stream message, in each shard.
type wrongTypeFixture struct {
	s      *Store
	ids    [2]map[string]string // per shard, name → id
	claims map[string]Claimed
}

const wrongTypeFp = "fp-aaaaa"

var wrongTypeNS atomic.Int64

func newWrongTypeFixture(t *testing.T, r *testutil.Redis) *wrongTypeFixture {
	t.Helper()
	ctx := context.Background()
	ns := "w" + strconv.FormatInt(wrongTypeNS.Add(1), 10)
	s := New(NewClient(Options{Addrs: []string{r.Addr}}), ns, 2, WithResendMemory(time.Hour), WithStreamMemory(time.Hour))
	t.Cleanup(func() { s.Close() })
	f := &wrongTypeFixture{s: s}
	for sh := range 2 {
		f.ids[sh] = map[string]string{}
		for _, name := range []string{"dead", "tomb", "exp", "seen", "set", "setdue", "ser", "bkt", "bktdue", "new"} {
			for i := 0; ; i++ {
				if id := name + strconv.Itoa(i); s.Shard(id) == sh {
					f.ids[sh][name] = id
					break
				}
			}
		}
	}
	id := func(sh int, name string) string { return f.ids[sh][name] }
	both := func(fn func(sh int) Item) []Item { return []Item{fn(0), fn(1)} }
	past := func(name string, ms int64) func(int) Item {
		return func(sh int) Item { return Item{ID: id(sh, name), Absolute: true, AtMicros: ms * 1000, Data: enc(name)} }
	}
	hour := int64(time.Hour / time.Microsecond)

	s.write.Store(FormatIntegerLeases)
	schedule(t, s, both(past("dead", 1))...)
	schedule(t, s, both(func(sh int) Item {
		return Item{ID: id(sh, "tomb"), Absolute: true, AtMicros: 1000, Request: wrongTypeFp, Data: enc("t")}
	})...)
	settles := map[int][]Settle{}
	for _, c := range claimAll(t, s, time.Minute) {
		st := Settle{ID: c.ID, Token: c.Token, Outcome: Bury, Error: "boom"}
		if strings.HasPrefix(c.ID, "tomb") {
			st = Settle{ID: c.ID, Token: c.Token, Outcome: Delivered, Request: wrongTypeFp, SinceMs: time.Now().UnixMilli()}
		}
		settles[s.Shard(c.ID)] = append(settles[s.Shard(c.ID)], st)
	}
	if a, err := s.Ack(ctx, settles, time.Second); err != nil || a.Settled != 4 {
		t.Fatalf("fixture: ack %+v %v", a, err)
	}
	schedule(t, s, both(past("exp", 1))...)
	if n := len(claimAll(t, s, time.Millisecond)); n != 2 {
		t.Fatalf("fixture: %d claimed, want the 2 to expire", n)
	}
	schedule(t, s, both(func(sh int) Item {
		return Item{ID: id(sh, "seen"), DelayMicros: hour, StreamMsg: "m" + strconv.Itoa(sh), Data: enc("s")}
	})...)
	schedule(t, s, both(func(sh int) Item { return Item{ID: id(sh, "set"), DelayMicros: hour, Data: enc("p")} })...)
	schedule(t, s, both(past("setdue", 2))...)
	schedule(t, s, both(func(sh int) Item {
		return Item{ID: id(sh, "ser"), Absolute: true, AtMicros: 3000, Series: true, Data: enc("r")}
	})...)
	schedule(t, s, both(func(sh int) Item { return Item{ID: id(sh, "bkt"), DelayMicros: hour, Data: enc("b")} })...)
	schedule(t, s, both(past("bktdue", 4))...)
	time.Sleep(5 * time.Millisecond) // the expired leases
	return f
}

// dump is every key of the fixture's namespace that starts with prefix,
// DUMPed.
func (f *wrongTypeFixture) dump(t *testing.T, prefix string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	keys, err := f.s.rdb.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		v, err := f.s.rdb.Dump(ctx, k).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		out[k] = v
	}
	return out
}

// scheduleItems schedules items in one call (a single Redis) and returns
// the first error.
func scheduleItems(f *wrongTypeFixture, items []Item) error {
	_, errs := f.s.Schedule(context.Background(), items)
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func wrongTypeCases() []wrongTypeCase {
	all := func(f *wrongTypeFixture, name string) []string { return []string{f.ids[0][name], f.ids[1][name]} }
	scheduleRun := func(f *wrongTypeFixture, _ int) error {
		var items []Item
		for sh := range 2 {
			id := f.ids[sh]
			items = append(items,
				// Remembered stream message: not stored again.
				Item{ID: id["seen"], DelayMicros: 1, StreamMsg: "m" + strconv.Itoa(sh), Data: enc("s")},
				// A resend of a delivered request: answered, not stored.
				Item{ID: id["tomb"], Absolute: true, AtMicros: 1000, Request: wrongTypeFp, Data: enc("t")},
				// New, with a stream message and a fingerprint.
				Item{ID: id["new"], DelayMicros: 1000, StreamMsg: "n" + strconv.Itoa(sh), Request: wrongTypeFp, Data: enc("n")},
				// Replaces: of a dead one (attempts, errors), a leased
				// one, a pending one.
				Item{ID: id["dead"], DelayMicros: 2000, Data: enc("d")},
				Item{ID: id["exp"], DelayMicros: 2000, Data: enc("e")},
				Item{ID: id["bkt"], DelayMicros: 2000, Data: enc("b")},
			)
		}
		return scheduleItems(f, items)
	}
	scheduleNew := func(f *wrongTypeFixture, _ int) error {
		var items []Item
		for sh := range 2 {
			items = append(items, Item{ID: f.ids[sh]["new"], DelayMicros: 1000, StreamMsg: "n" + strconv.Itoa(sh),
				Request: wrongTypeFp, Data: enc("n")})
		}
		return scheduleItems(f, items)
	}
	// A store reads every key its replace may clear (schedule.lua), new
	// ids or not; never the due buckets.
	return []wrongTypeCase{
		{name: "schedule", touches: []string{"due", "inflight", "data", "attempts", "dead", "errors", "seen", "done"},
			run: scheduleRun},
		{name: "schedule/new", touches: []string{"due", "inflight", "data", "attempts", "dead", "errors", "seen", "done"},
			run: scheduleNew},
		{name: "cancel", oneShard: true, callPerShard: true, touches: []string{"due", "inflight", "data", "attempts", "dead", "errors"},
			run: func(f *wrongTypeFixture, sh int) error {
				_, err := f.s.Cancel(context.Background(), f.ids[sh]["bkt"])
				return err
			}},
		{name: "cancel/leased", oneShard: true, callPerShard: true, touches: []string{"due", "inflight", "data", "attempts", "dead", "errors"},
			run: func(f *wrongTypeFixture, sh int) error {
				_, err := f.s.Cancel(context.Background(), f.ids[sh]["exp"])
				return err
			}},
		{name: "purge", callPerShard: true, touches: []string{"due", "inflight", "data", "attempts", "dead", "errors"},
			run: func(f *wrongTypeFixture, _ int) error {
				_, err := f.s.Purge(context.Background(), all(f, "dead"))
				return err
			}},
		{name: "claim", callPerShard: true, touches: []string{"due", "inflight", "data", "attempts", "lease"},
			run: func(f *wrongTypeFixture, _ int) error {
				_, err := f.s.Claim(context.Background(), []int{0, 1}, ClaimOptions{Batch: 100, Lease: time.Minute})
				return err
			}},
		{name: "claim/expired-only", callPerShard: true, touches: []string{"due", "inflight", "data", "attempts", "lease"},
			run: func(f *wrongTypeFixture, _ int) error {
				_, err := f.s.Claim(context.Background(), []int{0, 1}, ClaimOptions{Batch: 1, Lease: time.Minute})
				return err
			}},
		{name: "ack", callPerShard: true, touches: []string{"due", "inflight", "data", "attempts", "dead", "errors", "done"},
			prepare: func(t *testing.T, f *wrongTypeFixture) { f.claims = claimAll(t, f.s, time.Minute) },
			run: func(f *wrongTypeFixture, _ int) error {
				settles := map[int][]Settle{}
				for sh := range 2 {
					id := f.ids[sh]
					c := func(name string) Claimed { return f.claims[id[name]] }
					settles[sh] = []Settle{
						{ID: id["setdue"], Token: c("setdue").Token, Outcome: Delivered, Request: wrongTypeFp, SinceMs: 1},
						{ID: id["ser"], Token: c("ser").Token, Outcome: Next, NextDueMs: time.Now().Add(time.Hour).UnixMilli()},
						{ID: id["exp"], Token: c("exp").Token, Outcome: Retry, Error: "again"},
						{ID: id["bktdue"], Token: c("bktdue").Token, Outcome: Bury, Error: "gone"},
					}
				}
				_, err := f.s.Ack(context.Background(), settles, time.Second)
				return err
			}},
		{name: "ack/delivered", callPerShard: true, touches: []string{"inflight", "data", "attempts", "errors", "done"},
			prepare: func(t *testing.T, f *wrongTypeFixture) { f.claims = claimAll(t, f.s, time.Minute) },
			run: func(f *wrongTypeFixture, _ int) error {
				settles := map[int][]Settle{}
				for sh := range 2 {
					for _, name := range []string{"setdue", "bktdue", "exp"} {
						id := f.ids[sh][name]
						settles[sh] = append(settles[sh], Settle{ID: id, Token: f.claims[id].Token, Outcome: Delivered})
					}
				}
				_, err := f.s.Ack(context.Background(), settles, time.Second)
				return err
			}},
		{name: "replay", callPerShard: true, touches: []string{"due", "data", "attempts", "dead", "errors"},
			run: func(f *wrongTypeFixture, _ int) error {
				_, err := f.s.Replay(context.Background(), all(f, "dead"))
				return err
			}},
		{name: "check", oneShard: true, callPerShard: true, touches: keyNames,
			run: func(f *wrongTypeFixture, sh int) error {
				_, err := f.s.Check(context.Background(), sh, CheckOptions{Repair: true})
				return err
			}},
	}
}

// TestWrongTypeWritesNothing: for every script operation (ops.go) and
// every key of a shard, a key of the wrong type (changed behind delayd's
// back) that the call touches fails it before anything is written: the
// error names the key and wraps ErrNotWritten, and every key of the
// namespace DUMPs the same after. Redis does not roll back a script, and
// the scripts check types only where a read does not come first
// (lua/prelude.lua), so a write moved before a read shows here. A key the
// call does not touch does not fail it, and stays as it was.
func TestWrongTypeWritesNothing(t *testing.T) {
	t.Parallel()
	r := testutil.StartRedis(t)
	ctx := context.Background()
	for _, c := range wrongTypeCases() {
		t.Run(c.name, func(t *testing.T) {
			shards := []int{0, 1}
			for _, sh := range shards {
				if c.oneShard && sh == 0 {
					continue
				}
				for i, name := range keyNames {
					f := newWrongTypeFixture(t, r)
					if c.prepare != nil {
						c.prepare(t, f)
					}
					key := f.s.keys[sh].list()[i]
					if err := f.s.rdb.Set(ctx, key, "oops", 0).Err(); err != nil {
						t.Fatal(err)
					}
					prefix := "{" + f.s.ns + ":"
					if c.callPerShard {
						prefix += strconv.Itoa(sh) + "}"
					}
					before := f.dump(t, prefix)
					err := c.run(f, sh)
					after := f.dump(t, prefix)
					touched := false
					for _, n := range c.touches {
						touched = touched || n == name
					}
					what := fmt.Sprintf("%s with shard %d's %s a string", c.name, sh, name)
					if !touched {
						if err != nil {
							t.Errorf("%s: failed (%v), but it does not touch the key", what, err)
						}
						if after[key] != before[key] {
							t.Errorf("%s: the key was changed", what)
						}
						continue
					}
					if err == nil {
						t.Errorf("%s: succeeded", what)
						continue
					}
					if want := "WRONGTYPE delayd key " + key + " is a string, not a "; !strings.Contains(err.Error(), want) {
						t.Errorf("%s: error %q does not say %q", what, err, want)
					}
					if !errors.Is(err, ErrNotWritten) {
						t.Errorf("%s: error %v is not ErrNotWritten", what, err)
					}
					if !maps.Equal(before, after) {
						for k := range maps.Keys(before) {
							if before[k] != after[k] {
								t.Errorf("%s: wrote %s", what, k)
							}
						}
						for k := range maps.Keys(after) {
							if _, ok := before[k]; !ok {
								t.Errorf("%s: created %s", what, k)
							}
						}
					}
				}
			}
		})
	}
}
