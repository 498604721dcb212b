package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/envelope"
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

// TestResendOrder: which request wins when a resend of an older request A
// and a newer request B for the same id cross. A tombstone proves A was
// delivered, so whatever is stored for the id now came after A: a resend
// of A answered from its tombstone leaves it alone. Without a tombstone
// (A was replaced while pending) delayd cannot tell a late resend of A
// from a new request, and the last one stored wins, as any upsert.
func TestResendOrder(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	s.resends = time.Minute
	// deliver claims and acks id, which must be the only one due.
	deliver := func(id, fp string) int64 {
		t.Helper()
		got := claimAll(t, s, time.Minute)
		c, ok := got[id]
		if !ok || len(got) != 1 {
			t.Fatalf("claimed %d envelopes, want %s alone", len(got), id)
		}
		if _, err := s.Ack(ctx, map[int][]Settle{s.Shard(id): {{ID: id, Token: c.Token, Outcome: Delivered,
			Request: fp, SinceMs: c.DueMs}}}, time.Second); err != nil {
			t.Fatal(err)
		}
		return c.DueMs
	}
	// holds fails unless id is stored pending with payload and due time.
	holds := func(step, id, payload string, dueMs int64) {
		t.Helper()
		e, err := s.Get(ctx, id)
		if err != nil {
			t.Fatalf("%s: %s: %v, want %q stored", step, id, err, payload)
		}
		if !bytes.Equal(e.Data, enc(payload)) || e.DueMs != dueMs || e.State != StatePending {
			t.Fatalf("%s: %s holds %q (%s, due %d), want %q pending, due %d",
				step, id, envelopePayload(t, e.Data), e.State, e.DueMs, payload, dueMs)
		}
	}
	a := func(id string) Item { return Item{ID: id, Request: "fp-aaaaa", Data: enc("a")} }
	b := func(id string) Item {
		return Item{ID: id, Request: "fp-bbbbb", Data: enc("b"), DelayMicros: 30e6}
	}

	// A delivered, B stored, A resent: B is kept, A is answered from its
	// tombstone with its own deliver_at.
	schedule(t, s, a("o1"))
	aDue := deliver("o1", "fp-aaaaa")
	bDue := schedule(t, s, b("o1"))[0]
	if got := schedule(t, s, a("o1"))[0]; got != -aDue {
		t.Fatalf("A resent after B: due %d, want %d (A's, negated)", got, -aDue)
	}
	holds("A resent after B", "o1", "b", bDue)

	// The same with B and the resend of A in one batch, in that order.
	schedule(t, s, a("o2"))
	aDue = deliver("o2", "fp-aaaaa")
	got := schedule(t, s, b("o2"), a("o2"))
	if got[0] <= 0 || got[1] != -aDue {
		t.Fatalf("B then A resent in one batch: due %v, want B stored and %d", got, -aDue)
	}
	holds("B then A resent in one batch", "o2", "b", got[0])

	// A delivered, A resent, then B: B is stored.
	schedule(t, s, a("o3"))
	aDue = deliver("o3", "fp-aaaaa")
	if got := schedule(t, s, a("o3"))[0]; got != -aDue {
		t.Fatalf("A resent: due %d, want %d", got, -aDue)
	}
	bDue = schedule(t, s, b("o3"))[0]
	holds("B after A resent", "o3", "b", bDue)

	// A pending, A resent: replaced, as always.
	a4 := Item{ID: "o4", Request: "fp-aaaaa", Data: enc("a"), DelayMicros: 30e6}
	schedule(t, s, a4)
	again := schedule(t, s, a4)[0]
	holds("A resent while pending", "o4", "a", again)

	// B replaced A while pending, then A is resent: no tombstone, so A is
	// a new request and replaces B.
	schedule(t, s, a4)
	schedule(t, s, b("o4"))
	again = schedule(t, s, a4)[0]
	if again <= 0 {
		t.Fatalf("A resent after B replaced it pending: due %d, want stored", again)
	}
	holds("A resent after B replaced it pending", "o4", "a", again)

	// A delivered, B stored and delivered: each resend is answered from
	// its own tombstone, and neither is stored again.
	schedule(t, s, a("o5"))
	aDue = deliver("o5", "fp-aaaaa")
	schedule(t, s, Item{ID: "o5", Request: "fp-bbbbb", Data: enc("b")})
	bDue = deliver("o5", "fp-bbbbb")
	got = schedule(t, s, a("o5"), Item{ID: "o5", Request: "fp-bbbbb", Data: enc("b")})
	if got[0] != -aDue || got[1] != -bDue {
		t.Fatalf("A and B resent after both were delivered: due %v, want [%d %d]", got, -aDue, -bDue)
	}
	if _, err := s.Get(ctx, "o5"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("o5 after both resends: %v, want not stored", err)
	}
	mustBeConsistent(t, s)
}

// envelopePayload is the payload of an encoded envelope, for messages.
func envelopePayload(t *testing.T, data []byte) string {
	t.Helper()
	e, err := envelope.Decode(data)
	if err != nil {
		return fmt.Sprintf("undecodable: %v", err)
	}
	return string(e.Payload)
}
