package store

import (
	"context"
	"testing"
	"time"
)

// TestResendOfADeliveredRequest: once an id with a request fingerprint is
// delivered, a resend of the same request within the window is answered
// with the due time it had (negated) and stores nothing; a different
// request under the id is a new version; a resend past the window, or
// while the id is still stored, is stored as before (a replace).
func TestResendOfADeliveredRequest(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	s.resends = time.Minute
	deliverSince := func(id, fp string, since int64) int64 {
		t.Helper()
		c, ok := claimAll(t, s, time.Minute)[id]
		if !ok {
			t.Fatalf("%s not claimed", id)
		}
		if since == 0 {
			since = c.DueMs
		}
		if _, err := s.Ack(ctx, map[int][]Settle{s.Shard(id): {{ID: id, Token: c.Token, Outcome: Delivered,
			Request: fp, SinceMs: since}}}, time.Second); err != nil {
			t.Fatal(err)
		}
		return c.DueMs
	}
	deliver := func(id, fp string) int64 { return deliverSince(id, fp, 0) }
	stored := func(id string) bool {
		return s.rdb.HExists(ctx, s.keys[s.Shard(id)].data, id).Val()
	}

	first := schedule(t, s, Item{ID: "r1", Request: "fp-aaaaa", Data: enc("p")})[0]
	// While stored, the same request replaces it, as always.
	if again := schedule(t, s, Item{ID: "r1", Request: "fp-aaaaa", Data: enc("p")})[0]; again <= 0 {
		t.Fatalf("a resend while stored: due %d, want it stored again (a replace)", again)
	}
	dueMs := deliver("r1", "fp-aaaaa")
	if stored("r1") {
		t.Fatal("r1 still stored after its ack")
	}
	if first <= 0 || dueMs <= 0 {
		t.Fatalf("due %d, claimed due %d", first, dueMs)
	}
	if got := schedule(t, s, Item{ID: "r1", Request: "fp-aaaaa", Data: enc("p"), DelayMicros: 5e6})[0]; got != -dueMs {
		t.Fatalf("a resend after delivery: due %d, want %d (the due time it had, negated)", got, -dueMs)
	}
	if stored("r1") {
		t.Fatal("a resend of a delivered request was stored again")
	}
	// Another request under the id: a new version.
	if got := schedule(t, s, Item{ID: "r1", Request: "fp-bbbbb", Data: enc("q")})[0]; got <= 0 || !stored("r1") {
		t.Fatalf("a different request: due %d, stored %v; want a new version stored", got, stored("r1"))
	}
	deliver("r1", "fp-bbbbb")

	// Without a fingerprint (a generated id, a series) nothing is kept.
	schedule(t, s, Item{ID: "r2", Data: enc("p")})
	deliver("r2", "")
	if got := schedule(t, s, Item{ID: "r2", Data: enc("p")})[0]; got <= 0 {
		t.Fatalf("no fingerprint: due %d, want stored", got)
	}

	// Past the window: a tombstone due more than a window ago answers
	// nothing, and the next ack drops it.
	old := time.Now().Add(-2 * time.Minute)
	schedule(t, s, Item{ID: "r3", Request: "fp-ccccc", Absolute: true, AtMicros: old.UnixMicro(), Data: enc("p")})
	deliver("r3", "fp-ccccc")
	if got := schedule(t, s, Item{ID: "r3", Request: "fp-ccccc", Absolute: true, AtMicros: old.UnixMicro(), Data: enc("p")})[0]; got <= 0 {
		t.Fatalf("a resend past the window: due %d, want stored", got)
	}
	deliver("r3", "fp-ccccc")
	if n := s.rdb.ZCard(ctx, s.keys[s.Shard("r3")].done).Val(); n > 1 && s.Shard("r3") != s.Shard("r1") {
		t.Fatalf("%d tombstones past the window kept", n)
	}

	// A Delayd-At further in the past than the window: its tombstone
	// counts from when it was accepted, and the resend is answered with
	// its own due time.
	pastDue := ceilMs(old.UnixMicro())
	schedule(t, s, Item{ID: "r5", Request: "fp-eeeee", Absolute: true, AtMicros: old.UnixMicro(), Data: enc("p")})
	deliverSince("r5", "fp-eeeee", time.Now().UnixMilli())
	if got := schedule(t, s, Item{ID: "r5", Request: "fp-eeeee", Absolute: true, AtMicros: old.UnixMicro(), Data: enc("p")})[0]; got != -pastDue {
		t.Fatalf("a resend of a past Delayd-At: due %d, want %d", got, -pastDue)
	}

	// Off: nothing is remembered, and the next ack of a shard drops what
	// it kept.
	s.resends = 0
	schedule(t, s, Item{ID: "r5", Request: "fp-fffff", Data: enc("p")})
	deliver("r5", "fp-fffff")
	if n := s.rdb.ZCard(ctx, s.keys[s.Shard("r5")].done).Val(); n != 0 {
		t.Fatalf("resends off: %d tombstones kept in r5's shard", n)
	}
	if got := schedule(t, s, Item{ID: "r5", Request: "fp-fffff", Data: enc("p")})[0]; got <= 0 {
		t.Fatalf("resends off: due %d, want stored", got)
	}
	mustBeConsistent(t, s)
}
