package store

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// DropNamespace removes every key of its namespace, the lease hashes and
// the member list included, and nothing of another namespace, even one
// whose name starts the same or holds a glob character.
func TestDropNamespace(t *testing.T) {
	t.Parallel()
	s, r := newStore(t)
	ctx := context.Background()
	rc := r.Client()
	mk := func(ns string) *Store {
		st := New(s.rdb, ns, 4)
		schedule(t, st, Item{ID: "a", Absolute: true, AtMicros: 1, Data: enc("x")}, Item{ID: "b", Data: enc("y"), DelayMicros: 3600e6})
		if _, err := st.Claim(ctx, []int{0, 1, 2, 3}, ClaimOptions{Batch: 10, Lease: time.Minute}); err != nil {
			t.Fatal(err)
		}
		return st
	}
	mk("bench-x")
	mk("bench-x2")
	mk("b*")
	mk("bench-x:eu") // its keys start "{bench-x:" too
	if _, err := rc.ZAdd(ctx, membersKey("bench-x"), redis.Z{Score: 1, Member: "d1"}).Result(); err != nil {
		t.Fatal(err)
	}
	n, err := DropNamespace(ctx, s.rdb, "bench-x")
	if err != nil || n == 0 {
		t.Fatalf("drop: %d keys, %v", n, err)
	}
	if left, err := rc.Keys(ctx, "{bench-x:members}*").Result(); err != nil || len(left) != 0 {
		t.Fatalf("member list left in the dropped namespace: %v %v", left, err)
	}
	if keys, _ := rc.Keys(ctx, "{bench-x:eu:*").Result(); len(keys) == 0 {
		t.Fatal("dropping bench-x took namespace bench-x:eu's keys")
	}
	if keys, _ := rc.Keys(ctx, "{bench-x:[0-9]*").Result(); len(keys) != 0 {
		t.Fatalf("keys left in the dropped namespace: %v", keys)
	}
	for _, ns := range []string{"bench-x2", "b*"} {
		if keys, _ := rc.Keys(ctx, globEscape("{"+ns+":")+"*").Result(); len(keys) == 0 {
			t.Fatalf("namespace %s lost its keys", ns)
		}
	}
	if n, err := DropNamespace(ctx, s.rdb, "b*"); err != nil || n == 0 {
		t.Fatalf("drop b*: %d %v", n, err)
	}
	if keys, _ := rc.Keys(ctx, "{bench-x2:*").Result(); len(keys) == 0 {
		t.Fatal("dropping b* took bench-x2's keys: the * was not escaped")
	}
}
