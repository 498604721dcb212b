package store

import (
	"context"
	"reflect"
	"strconv"
	"testing"
	"time"
)

// An ack whose call fails on one shard settles the others, returns the
// failed shard's settles as Unsettled, for a retry to send just those,
// and leaves its caller's map as it was.
func TestAckReturnsWhatItDidNotSettle(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	// Two ids in different shards.
	ids := []string{"a"}
	for i := 0; len(ids) < 2; i++ {
		if id := "b" + strconv.Itoa(i); s.Shard(id) != s.Shard("a") {
			ids = append(ids, id)
		}
	}
	for _, id := range ids {
		schedule(t, s, Item{ID: id, Absolute: true, AtMicros: 1000, Data: enc("x")})
	}
	claimed := claimAll(t, s, time.Minute)
	byShard := map[int][]Settle{}
	for _, id := range ids {
		c := claimed[id]
		byShard[s.Shard(id)] = append(byShard[s.Shard(id)], Settle{ID: id, Token: c.Token, Outcome: Delivered})
	}
	want := map[int][]Settle{}
	for sh, v := range byShard {
		want[sh] = append([]Settle(nil), v...)
	}
	// The second id's shard fails its key check (WRONGTYPE) before any write.
	broken := s.Shard(ids[1])
	if err := s.rdb.Set(ctx, s.keys[broken].errors, "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	a, err := s.Ack(ctx, byShard, time.Second)
	if err == nil {
		t.Fatal("ack with a broken shard succeeded")
	}
	if a.Settled != 1 {
		t.Errorf("%d settled, want the 1 of the shard that works", a.Settled)
	}
	if !reflect.DeepEqual(a.Unsettled, map[int][]Settle{broken: want[broken]}) {
		t.Errorf("unsettled %+v, want shard %d's %+v", a.Unsettled, broken, want[broken])
	}
	if !reflect.DeepEqual(byShard, want) {
		t.Errorf("the caller's map was changed to %+v", byShard)
	}
	// Repaired, the retry of what was left settles it.
	if err := s.rdb.Del(ctx, s.keys[broken].errors).Err(); err != nil {
		t.Fatal(err)
	}
	if a, err := s.Ack(ctx, a.Unsettled, time.Second); err != nil || a.Settled != 1 || a.Unsettled != nil {
		t.Errorf("retry: %+v, %v; want 1 settled, nothing left", a, err)
	}
}
