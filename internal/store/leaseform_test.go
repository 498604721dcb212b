package store

import (
	"context"
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

// TestIntegerLeaseScores: a lease score is the claim's token as an
// integer (expiry ms × 1000 + k), which the settle names, Get reads as the
// lease expiry, and Check accepts.
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

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
