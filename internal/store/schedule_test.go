package store

import (
	"bytes"
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// TestScheduleReplacesInOneBatch: one call that replaces an id in flight,
// a dead one and one retrying (attempts and an error), beside new ids and
// an id named twice, stores each once: the last version of an id wins,
// and a replace forgets the old version's claim, attempts, error and
// death, so the old claim's ack settles nothing.
func TestScheduleReplacesInOneBatch(t *testing.T) {
	t.Parallel()
	r, _ := newStore(t)
	s := New(r.rdb, "rb", 1)
	ctx := context.Background()
	now := func(id string) Item { return Item{ID: id, Absolute: true, AtMicros: 1000, Data: enc("old")} }
	schedule(t, s, now("lease"), now("dead"), now("retry"))
	c := claimAll(t, s, time.Minute)
	if len(c) != 3 {
		t.Fatalf("claimed %d, want 3", len(c))
	}
	if a, err := s.Ack(ctx, map[int][]Settle{0: {
		{ID: "dead", Token: c["dead"].Token, Outcome: Bury, Error: "boom"},
		{ID: "retry", Token: c["retry"].Token, Outcome: Retry, Error: "again"},
	}}, time.Hour); err != nil || a.Settled != 2 {
		t.Fatalf("ack: %+v %v", a, err)
	}
	k := s.keys[0]
	if r.rdb.HLen(ctx, k.attempts).Val() == 0 || r.rdb.HLen(ctx, k.errors).Val() != 2 ||
		r.rdb.ZCard(ctx, k.dead).Val() != 1 || r.rdb.ZCard(ctx, k.inflight).Val() != 1 {
		t.Fatal("fixture: want attempts, 2 errors, 1 dead, 1 in flight")
	}

	later := func(id, payload string, minutes int64) Item {
		return Item{ID: id, DelayMicros: minutes * 60e6, Data: enc(payload)}
	}
	items := []Item{later("new1", "n1", 1), later("lease", "l", 2), later("twice", "t1", 3), later("dead", "d", 4),
		later("retry", "r", 5), later("twice", "t2", 6), later("new2", "n2", 7)}
	due := schedule(t, s, items...)
	for i, it := range items {
		if due[i] <= 0 {
			t.Fatalf("%s: due %d, want stored", it.ID, due[i])
		}
	}
	for i, it := range items {
		if it.ID == "twice" && i == 2 {
			continue // the last version wins
		}
		e, err := s.Get(ctx, it.ID)
		if err != nil {
			t.Fatalf("%s: %v", it.ID, err)
		}
		if e.State != StatePending || e.DueMs != due[i] || !bytes.Equal(e.Data, it.Data) || e.Attempts != 0 || e.Error != "" {
			t.Fatalf("%s: %s due %d, %d attempts, error %q, %q; want pending due %d, %q, no attempts or error",
				it.ID, e.State, e.DueMs, e.Attempts, e.Error, envelopePayload(t, e.Data), due[i], envelopePayload(t, it.Data))
		}
	}
	if n := r.rdb.ZCard(ctx, k.due).Val(); n != 6 {
		t.Fatalf("%d in the due set, want 6", n)
	}
	for _, key := range []string{k.inflight, k.dead} {
		if n := r.rdb.ZCard(ctx, key).Val(); n != 0 {
			t.Fatalf("%s holds %d", key, n)
		}
	}
	for _, key := range []string{k.attempts, k.errors} {
		if n := r.rdb.HLen(ctx, key).Val(); n != 0 {
			t.Fatalf("%s holds %d", key, n)
		}
	}
	if got := settle(t, s, c["lease"], Delivered, 0); got != 0 {
		t.Fatalf("the replaced claim's ack settled %d", got)
	}
	if _, err := s.Get(ctx, "lease"); err != nil {
		t.Fatalf("the replaced claim's ack removed the new version: %v", err)
	}
	mustBeConsistent(t, s)
}

// TestScheduleAnswersBesideStores: in one call over one shard, a resend
// of a delivered request, a stream message stored already and one named
// twice are answered beside the envelopes stored, and only those are.
func TestScheduleAnswersBesideStores(t *testing.T) {
	t.Parallel()
	r, _ := newStore(t)
	s := New(r.rdb, "ab", 1, WithResendMemory(time.Minute), WithStreamMemory(time.Minute))
	ctx := context.Background()
	schedule(t, s, Item{ID: "r", Request: "fp-aaaaa", Absolute: true, AtMicros: time.Now().UnixMicro(), Data: enc("a")},
		Item{ID: "m", StreamMsg: "1@1", DelayMicros: 3600e6, Data: enc("m")})
	c := claimAll(t, s, time.Minute)["r"]
	if _, err := s.Ack(ctx, map[int][]Settle{0: {{ID: "r", Token: c.Token, Outcome: Delivered, Request: "fp-aaaaa",
		SinceMs: c.DueMs}}}, time.Second); err != nil {
		t.Fatal(err)
	}
	items := []Item{
		{ID: "n1", Request: "fp-n1", DelayMicros: 60e6, Data: enc("n1")},
		{ID: "r", Request: "fp-aaaaa", DelayMicros: 60e6, Data: enc("a")}, // resent: answered
		{ID: "n2", StreamMsg: "1@1", DelayMicros: 60e6, Data: enc("x")},   // stored already
		{ID: "n3", StreamMsg: "2@1", Request: "fp-n3", DelayMicros: 60e6, Data: enc("n3")},
		{ID: "n4", StreamMsg: "2@1", DelayMicros: 60e6, Data: enc("x")}, // the same message again
		// Resent and its message stored already: the message answers.
		{ID: "r", Request: "fp-aaaaa", StreamMsg: "1@1", DelayMicros: 60e6, Data: enc("a")},
		{ID: "n5", DelayMicros: 60e6, Data: enc("n5")},
	}
	due := schedule(t, s, items...)
	if due[0] <= 0 || due[1] != -c.DueMs || due[2] != 0 || due[3] <= 0 || due[4] != 0 || due[5] != 0 || due[6] <= 0 {
		t.Fatalf("answers %v, want stored, %d, 0, stored, 0, 0, stored", due, -c.DueMs)
	}
	for _, id := range []string{"r", "n2", "n4"} {
		if _, err := s.Get(ctx, id); err == nil {
			t.Fatalf("%s stored", id)
		}
	}
	for _, i := range []int{0, 3, 6} {
		if e, err := s.Get(ctx, items[i].ID); err != nil || e.DueMs != due[i] || !bytes.Equal(e.Data, items[i].Data) {
			t.Fatalf("%s: %+v %v", items[i].ID, e, err)
		}
	}
	// The message stored now is remembered.
	if due := schedule(t, s, Item{ID: "n6", StreamMsg: "2@1", DelayMicros: 60e6, Data: enc("x")}); due[0] != 0 {
		t.Fatalf("the message stored is not remembered: due %d", due[0])
	}
	mustBeConsistent(t, s)
}

// TestScheduleWritesTheDueSet: whatever format the fleet writes, schedule
// indexes in the due set (the due buckets are retired), on Redis and on
// the emulation of --embedded, in calls of several shards.
func TestScheduleWritesTheDueSet(t *testing.T) {
	t.Parallel()
	base, _ := newStore(t)
	mr := miniredis.RunT(t)
	emu := New(NewClient(Options{Addrs: []string{mr.Addr()}}), "e", 4)
	t.Cleanup(func() { emu.Close() })
	for name, s := range map[string]*Store{"redis": base, "emulation": emu} {
		s.write.Store(FormatDueBuckets)
		ctx := context.Background()
		var items []Item
		for _, id := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "a"} {
			items = append(items, Item{ID: id, DelayMicros: 3600e6, Data: enc(id)})
		}
		items[len(items)-1].Data = enc("last")
		due := schedule(t, s, items...)
		rc := s.rdb.(*redis.Client)
		total := int64(0)
		for sh := range s.Shards() {
			k := s.keys[sh]
			total += rc.ZCard(ctx, k.due).Val()
			if n := rc.ZCard(ctx, k.pending).Val(); n != 0 {
				t.Fatalf("%s: shard %d has %d buckets", name, sh, n)
			}
		}
		if total != 8 {
			t.Fatalf("%s: %d in the due sets, want 8", name, total)
		}
		if e, err := s.Get(ctx, "a"); err != nil || e.DueMs != due[len(due)-1] || !bytes.Equal(e.Data, enc("last")) {
			t.Fatalf("%s: a: %+v %v, want the last version", name, e, err)
		}
		mustBeConsistent(t, s)
	}
}

// TestScheduleAnswersInItemOrder: a call over several shards answers
// each item in the order given, whatever the order its shards take in
// the script, with or without fingerprints and stream messages, in any
// mode (which shape the shards' runs of ARGV differently).
func TestScheduleAnswersInItemOrder(t *testing.T) {
	t.Parallel()
	r, _ := newStore(t)
	s := New(r.rdb, "io", 5, WithResendMemory(time.Minute), WithStreamMemory(time.Minute))
	ctx := context.Background()
	var items []Item
	base := time.Now().UnixMicro()
	for i := range 40 {
		it := Item{ID: "o" + strconv.Itoa(i), DelayMicros: int64(i+1) * 60e6, Data: enc("x")}
		switch i % 4 {
		case 1:
			it.Absolute, it.AtMicros, it.DelayMicros = true, base+int64(i+1)*60e6, 0
		case 2:
			it.Series = true
		}
		if i%3 == 0 {
			it.Request = "fp-" + strconv.Itoa(i)
		}
		if i%7 == 0 {
			it.StreamMsg = strconv.Itoa(i) + "@1"
		}
		items = append(items, it)
	}
	due := schedule(t, s, items...)
	for i, it := range items {
		e, err := s.Get(ctx, it.ID)
		series := int64(0)
		if it.Series {
			series = 1
		}
		if err != nil || e.DueMs != due[i] || i > 0 && due[i] <= due[i-1] || e.Occurrence != series {
			t.Fatalf("%s: answered %d, stored %+v %v", it.ID, due[i], e, err)
		}
	}
	// Their stream messages are remembered, and only theirs.
	again := schedule(t, s, items...)
	for i, it := range items {
		if (again[i] == 0) != (it.StreamMsg != "") {
			t.Fatalf("%s (message %q) again: answered %d", it.ID, it.StreamMsg, again[i])
		}
	}
}
