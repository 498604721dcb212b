package store

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestCheckFindsAndRepairs breaks one shard's keys behind the scripts'
// back, one way per id, and checks that Check reports each kind
// read-only, and with Repair fixes it: data without an index is due now
// and delivered, an id in two indexes keeps one, entries without data go;
// a lease score that is no token is reported only.
func TestCheckFindsAndRepairs(t *testing.T) {
	t.Parallel()
	r, _ := newStore(t)
	s := New(r.rdb, "c", 1)
	ctx := context.Background()
	k := s.keys[0]
	for _, id := range []string{"unindexed", "twice", "gone", "leased"} {
		schedule(t, s, Item{ID: id, DelayMicros: 3600e6, Data: enc(id)})
	}
	s.rdb.ZRem(ctx, k.due, "unindexed")
	s.rdb.ZAdd(ctx, k.dead, redis.Z{Score: 1, Member: "twice"})
	s.rdb.HDel(ctx, k.data, "gone")
	s.rdb.HSet(ctx, k.errors, "ghost", "an error")
	s.rdb.ZRem(ctx, k.due, "leased")
	s.rdb.ZAdd(ctx, k.inflight, redis.Z{Score: 5000.5, Member: "leased"})
	want := map[string]int{KindUnindexedData: 1, KindMultiplyIndexed: 1, KindDueWithoutData: 1,
		KindErrorWithoutData: 1, KindInflightWithoutClaim: 1}
	for range 2 { // read-only: the same twice
		if found, err := s.Check(ctx, 0, CheckOptions{}); err != nil || !maps.Equal(found, want) {
			t.Fatalf("check: %v, %v; want %v", found, err, want)
		}
	}
	if found, err := s.Check(ctx, 0, CheckOptions{Repair: true}); err != nil || !maps.Equal(found, want) {
		t.Fatalf("repair: %v, %v; want %v", found, err, want)
	}
	after := map[string]int{KindInflightWithoutClaim: 1}
	if found, err := s.Check(ctx, 0, CheckOptions{}); err != nil || !maps.Equal(found, after) {
		t.Fatalf("after the repair: %v, %v; want %v", found, err, after)
	}
	if s.rdb.ZScore(ctx, k.dead, "twice").Err() == nil || s.rdb.ZScore(ctx, k.due, "twice").Err() != nil {
		t.Fatal("twice: want it kept in due only")
	}
	if n := s.rdb.HLen(ctx, k.errors).Val(); n != 0 {
		t.Fatalf("%d errors entries left", n)
	}
	// The leased one's lease score is no token: claimed once it ends (at
	// 5 s past the epoch), unlike the unindexed one, due now.
	got := claimAll(t, s, time.Minute)
	if _, ok := got["unindexed"]; !ok || len(got) != 2 {
		t.Fatalf("claimed %v, want the repaired unindexed envelope and the leased one", got)
	}
}
