package store

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"
)

// inflightScores reads a shard's lease scores straight from Redis.
func inflightScores(t *testing.T, s *Store, shard int) map[string]float64 {
	t.Helper()
	zs, err := s.rdb.ZRangeWithScores(context.Background(), s.keys[shard].inflight, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, z := range zs {
		out[z.Member.(string)] = z.Score
	}
	return out
}

// agreeOn announces s's formats as id and fails unless the fleet writes
// want.
func agreeOn(t *testing.T, s *Store, id string, want int) {
	t.Helper()
	if got, err := s.AgreeFormats(context.Background(), id, time.Minute); err != nil || got != want {
		t.Fatalf("%s writes format %d (%v), want %d", id, got, err, want)
	}
}

// TestIntegerLeaseScores: once every live daemon reads format 3, a lease
// score is the claim's token as an integer (expiry ms × 1000 + k), which
// the settle names, Get reads as the lease expiry, and Check accepts.
func TestIntegerLeaseScores(t *testing.T) {
	t.Parallel()
	r, _ := newStore(t)
	ctx := context.Background()
	a, b := New(r.rdb, "t", 4), New(r.rdb, "t", 4)
	agreeOn(t, a, "a", newestFormat)
	agreeOn(t, b, "b", newestFormat)
	schedule(t, a, Item{ID: "x", Absolute: true, AtMicros: 1000, Data: enc("x")})
	before := time.Now().UnixMilli()
	c := claimOnly(t, a, "x", time.Minute)
	after := time.Now().UnixMilli()
	score := inflightScores(t, a, a.Shard("x"))["x"]
	tok, err := strconv.ParseInt(c.Token, 10, 64)
	if err != nil || float64(tok) != score || score != math.Trunc(score) || tok%1000 == 0 {
		t.Fatalf("lease score %v, token %q: want the token as a whole number, not a multiple of 1000", score, c.Token)
	}
	if end := tok / 1000; end < before+60_000-5 || end > after+60_000+5 {
		t.Fatalf("the token %d ends its lease at %d ms, want about %d", tok, end, before+60_000)
	}
	e, err := b.Get(ctx, "x")
	if err != nil || e.State != StateInflight || e.DueMs != tok/1000 {
		t.Fatalf("Get: %+v %v, want inflight until %d", e, err, tok/1000)
	}
	mustBeConsistent(t, b)
	if settle(t, b, c, Delivered, 0) != 1 {
		t.Fatal("the claim's own token did not settle it")
	}
	mustBeConsistent(t, a)
}

// TestAMixedFleetKeepsFractionalLeases: while a daemon that reads only
// format 2 lives, a newer one still writes fractional lease scores, and
// switches once it left.
func TestAMixedFleetKeepsFractionalLeases(t *testing.T) {
	t.Parallel()
	r, _ := newStore(t)
	ctx := context.Background()
	older, newer := New(r.rdb, "t", 4, WithNewestFormat(FormatHeader)), New(r.rdb, "t", 4)
	agreeOn(t, older, "old", FormatHeader)
	agreeOn(t, newer, "new", FormatHeader)
	schedule(t, newer, Item{ID: "x", Absolute: true, AtMicros: 1000, Data: enc("x")})
	c := claimOnly(t, newer, "x", time.Minute)
	if score := inflightScores(t, newer, newer.Shard("x"))["x"]; score == math.Trunc(score) || score > leaseSplit {
		t.Fatalf("a mixed fleet wrote lease score %v, want a fraction", score)
	}
	if settle(t, older, c, Delivered, 0) != 1 {
		t.Fatal("not settled")
	}
	if _, err := older.AgreeFormats(ctx, "old", 0); err != nil {
		t.Fatal(err)
	}
	agreeOn(t, newer, "new", newestFormat)
	schedule(t, newer, Item{ID: "x", Absolute: true, AtMicros: 1000, Data: enc("x")})
	claimOnly(t, newer, "x", time.Minute)
	if score := inflightScores(t, newer, newer.Shard("x"))["x"]; score != math.Trunc(score) || score < leaseSplit {
		t.Fatalf("after the older daemon left: lease score %v, want a whole token", score)
	}
}

// TestBothLeaseForms: after the switch, the leases a format-2 daemon
// wrote (fractional scores, ~1.8e12) sit in one set beside integer ones
// (~1.8e15). A claim re-leases the expired of both forms, and neither an
// unexpired fractional lease (numerically below every integer one) nor an
// unexpired integer one; the next lease expiry is the earliest of both;
// each settles by its own token.
func TestBothLeaseForms(t *testing.T) {
	t.Parallel()
	r, _ := newStore(t)
	ctx := context.Background()
	two := New(r.rdb, "t", 1) // never announces: writes format 2
	three := New(r.rdb, "t", 1)
	agreeOn(t, three, "three", newestFormat)
	claim := func(s *Store, id string, lease time.Duration) Claimed {
		t.Helper()
		schedule(t, s, Item{ID: id, Absolute: true, AtMicros: 1000, Data: enc(id)})
		return claimOnly(t, s, id, lease)
	}
	// The short leases end after all four claims ran.
	oldGone, oldLive := claim(two, "old-expired", time.Second), claim(two, "old-live", time.Hour)
	newGone, newLive := claim(three, "new-expired", time.Second), claim(three, "new-live", time.Hour)
	scores := inflightScores(t, two, 0)
	for id, want := range map[string]bool{"old-expired": false, "old-live": false, "new-expired": true, "new-live": true} {
		if whole := scores[id] == math.Trunc(scores[id]); whole != want {
			t.Fatalf("%s: lease score %v, whole %v, want %v", id, scores[id], whole, want)
		}
	}
	if whole, fractional, err := two.LeaseForms(ctx); err != nil || whole != 2 || fractional != 2 {
		t.Fatalf("LeaseForms: %d whole, %d fractional (%v), want 2 and 2", whole, fractional, err)
	}
	time.Sleep(time.Second + 5*time.Millisecond)
	res, err := three.Claim(ctx, []int{0}, ClaimOptions{Batch: 10, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Claimed{}
	for _, c := range res[0].Items {
		got[c.ID] = c
	}
	if len(got) != 2 || got["old-expired"].Attempt != 2 || got["new-expired"].Attempt != 2 || res[0].Expired != 2 {
		t.Fatalf("the claim re-leased %v (%d expired), want old-expired and new-expired at attempt 2", got, res[0].Expired)
	}
	tok, _ := strconv.ParseInt(got["old-expired"].Token, 10, 64)
	if want := tok/1000 + 1; res[0].NextLeaseMs != want {
		t.Fatalf("next lease expiry %d, want %d (the minute lease, before both hour ones)", res[0].NextLeaseMs, want)
	}
	if s := inflightScores(t, two, 0)["old-expired"]; s != float64(tok) {
		t.Fatalf("the re-leased fractional lease has score %v, want %d", s, tok)
	}
	// The stale claims settle nothing; the live ones of both forms do, by
	// a daemon of either format.
	for _, c := range []Claimed{oldGone, newGone} {
		if settle(t, three, c, Delivered, 0) != 0 {
			t.Fatalf("the stale claim %+v settled", c)
		}
	}
	if settle(t, three, oldLive, Delivered, 0) != 1 || settle(t, two, newLive, Delivered, 0) != 1 {
		t.Fatal("a live claim did not settle by its token")
	}
	mustBeConsistent(t, two)
	for _, id := range []string{"old-expired", "new-expired"} {
		if settle(t, two, got[id], Delivered, 0) != 1 {
			t.Fatalf("%s: the re-lease did not settle", id)
		}
	}
	if n := len(inflightScores(t, two, 0)); n != 0 {
		t.Fatalf("%d leases left", n)
	}
}

// TestAScannerOfReleaseZeroOneKeepsFractionalLeases: a live member that
// announces no format (a 0.1.0 scanner) re-leases only fractional lease
// scores, so the fleet writes format 2 while it lives.
func TestAScannerOfReleaseZeroOneKeepsFractionalLeases(t *testing.T) {
	t.Parallel()
	r, _ := newStore(t)
	ctx := context.Background()
	legacy, newer := New(r.rdb, "t", 4), New(r.rdb, "t", 4)
	if _, _, err := legacy.Heartbeat(ctx, "legacy", time.Minute); err != nil {
		t.Fatal(err)
	}
	agreeOn(t, newer, "new", FormatHeader)
	if _, _, err := legacy.Heartbeat(ctx, "legacy", 0); err != nil {
		t.Fatal(err)
	}
	agreeOn(t, newer, "new", newestFormat)
}

// TestARollbackRewritesWholeLeases: when a daemon that reads only format
// 2 joins after the switch (a rollback), this version rewrites the whole
// lease scores as fractions naming the same tokens, which the older
// version re-leases when they expire; the claims still settle by their
// whole tokens.
func TestARollbackRewritesWholeLeases(t *testing.T) {
	t.Parallel()
	r, _ := newStore(t)
	ctx := context.Background()
	newer := New(r.rdb, "t", 4)
	agreeOn(t, newer, "new", FormatIntegerLeases)
	var claims []Claimed
	for _, id := range []string{"a", "b", "c"} {
		schedule(t, newer, Item{ID: id, Absolute: true, AtMicros: 1000, Data: enc(id)})
		claims = append(claims, claimOnly(t, newer, id, time.Hour))
	}
	older := New(r.rdb, "t", 4, WithNewestFormat(FormatHeader))
	agreeOn(t, older, "old", FormatHeader)
	agreeOn(t, newer, "new", FormatHeader)
	for _, c := range claims {
		n, _ := strconv.ParseInt(c.Token, 10, 64)
		want, _ := strconv.ParseFloat(fmt.Sprintf("%d.%03d", n/1000, n%1000), 64)
		if got := inflightScores(t, newer, newer.Shard(c.ID))[c.ID]; got != want {
			t.Fatalf("%s: lease score %v after the rollback, want %v (token %s as a fraction)", c.ID, got, want, c.Token)
		}
		if e, _ := newer.Get(ctx, c.ID); e.DueMs != n/1000 {
			t.Fatalf("%s: Get reads the lease expiry %d, want %d", c.ID, e.DueMs, n/1000)
		}
	}
	mustBeConsistent(t, newer)
	for _, c := range claims[:2] {
		if settle(t, older, c, Delivered, 0) != 1 {
			t.Fatalf("%s: the whole token did not settle the lease rewritten as its fraction", c.ID)
		}
	}
	// A stale whole token settles nothing, in either form.
	stale := claims[2]
	stale.Token = strconv.FormatInt(mustInt(t, stale.Token)+8, 10)
	if settle(t, newer, stale, Delivered, 0) != 0 {
		t.Fatal("a token that is no claim's settled")
	}
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
