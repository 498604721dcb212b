package store

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testutil"
)

// served counts the FCALLs the nodes served so far.
func served(t *testing.T, nodes ...*testutil.Redis) int {
	t.Helper()
	n := 0
	for _, r := range nodes {
		c, _ := fcalls(t, r)
		n += c
	}
	return n
}

// TestOneCallPerNode: a claim of every shard, and the ack of what it
// handed out, are one script call each on a single Redis, however many
// shards; every shard's envelopes are handed out and settled.
func TestOneCallPerNode(t *testing.T) {
	t.Parallel()
	r := testutil.StartRedis(t)
	s := New(NewClient(Options{Addrs: []string{r.Addr}}), "t", 16)
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	var items []Item
	for i := range 64 {
		items = append(items, Item{ID: fmt.Sprint("n", i), Absolute: true, AtMicros: 1000, Data: enc("x")})
	}
	schedule(t, s, items...)
	before := served(t, r)
	all := make([]int, 16)
	for i := range all {
		all[i] = i
	}
	res, err := s.Claim(ctx, all, ClaimOptions{Batch: 100, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if n := served(t, r) - before; n != 1 {
		t.Fatalf("a claim of 16 shards made %d calls, want 1", n)
	}
	before = served(t, r)
	byShard, got := map[int][]Settle{}, 0
	for _, r := range res {
		for _, c := range r.Items {
			byShard[r.Shard] = append(byShard[r.Shard], Settle{ID: c.ID, Token: c.Token, Outcome: Delivered})
			got++
		}
	}
	if got != 64 || len(byShard) < 8 {
		t.Fatalf("claimed %d of 64, from %d shards", got, len(byShard))
	}
	a, err := s.Ack(ctx, byShard, time.Second)
	if err != nil || a.Settled != 64 {
		t.Fatalf("ack: %+v, %v", a, err)
	}
	if n := served(t, r) - before; n != 1 {
		t.Fatalf("an ack of %d shards made %d calls, want 1", len(byShard), n)
	}
	mustBeConsistent(t, s)
}

// TestOneCallPerNodeUnderCluster: under Redis Cluster a claim and an ack
// make one call per master (the other shards of a node reached by
// allow-cross-slot-keys), and while a shard's slot moves to another
// master behind the client's slot map, the call that names it is refused
// before it wrote anything and goes again shard by shard: every envelope
// is handed out once and settled.
func TestOneCallPerNodeUnderCluster(t *testing.T) {
	t.Parallel()
	cl := testutil.StartRedisCluster(t)
	ctx := context.Background()
	s := New(NewClient(Options{Addrs: cl.Addrs()}), "t", 12)
	t.Cleanup(func() { s.Close() })
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	all := make([]int, 12)
	for i := range all {
		all[i] = i
	}
	masters := map[string]bool{}
	for _, g := range s.byNode(ctx, all) {
		masters[fmt.Sprint(g)] = true
	}
	// round schedules 48 envelopes due at once in the shards but skip's,
	// claims every shard, and settles what it got: each handed out once,
	// all of them, and every one settled. It returns the calls it made.
	round := func(prefix string, skip int) int {
		t.Helper()
		var items []Item
		for i := 0; len(items) < 48; i++ {
			if id := fmt.Sprint(prefix, i); s.Shard(id) != skip {
				items = append(items, Item{ID: id, Absolute: true, AtMicros: 1000, Data: enc("x")})
			}
		}
		schedule(t, s, items...)
		before := served(t, cl.Nodes...)
		res, err := s.Claim(ctx, all, ClaimOptions{Batch: 100, Lease: time.Minute})
		if err != nil && skip < 0 {
			t.Fatal(err)
		}
		byShard, got := map[int][]Settle{}, map[string]bool{}
		for _, r := range res {
			for _, c := range r.Items {
				if got[c.ID] {
					t.Fatalf("%s handed out twice", c.ID)
				}
				got[c.ID] = true
				byShard[r.Shard] = append(byShard[r.Shard], Settle{ID: c.ID, Token: c.Token, Outcome: Delivered})
			}
		}
		if len(got) != 48 {
			for _, r := range res {
				t.Logf("shard %d: %d items", r.Shard, len(r.Items))
			}
			for _, it := range items {
				t.Logf("%s in shard %d: %v", it.ID, s.Shard(it.ID), got[it.ID])
			}
			t.Fatalf("claimed %d of 48 (%v)", len(got), err)
		}
		if a, err := s.Ack(ctx, byShard, time.Second); err != nil || a.Settled != 48 {
			t.Fatalf("ack: %+v, %v", a, err)
		}
		calls := served(t, cl.Nodes...) - before
		return calls
	}
	if n, want := round("a", -1), 2*len(masters); n != want {
		t.Fatalf("claim and ack made %d calls, want one each per master: %d", n, want)
	}
	mustBeConsistent(t, s)
	// Shard 0's slot starts to move to another master, its keys not yet:
	// a call that reaches its missing keys (the lease hash) there is sent
	// elsewhere (ASK). The call of its node's shards is refused before it
	// wrote anything, and the others of the node go again one by one.
	slot := int(s.rdb.(*redis.ClusterClient).ClusterKeySlot(ctx, s.keys[0].due).Val())
	src := cl.MasterOf(t, slot)
	var dst *testutil.Redis
	for _, at := range []int{0, 6000, 12000} {
		if m := cl.MasterOf(t, at); m != src {
			dst = m
			break
		}
	}
	if err := dst.Client().Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", testutil.NodeID(t, src)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := src.Client().Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", testutil.NodeID(t, dst)).Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d calls while shard 0's slot migrates", round("m", 0))
	// Then it moves.
	cl.MigrateSlot(t, slot, dst)
	t.Logf("%d calls after the move", round("b", -1))
	if n, want := round("c", -1), 2*len(masters); n != want {
		t.Fatalf("claim and ack made %d calls, want one each per master: %d", n, want)
	}
	mustBeConsistent(t, s)
}

// idOf returns an id of shard sh, named from prefix.
func idOf(s *Store, sh int, prefix string) string {
	for i := 0; ; i++ {
		if id := fmt.Sprint(prefix, i); s.Shard(id) == sh {
			return id
		}
	}
}

// TestGroupedCallsWriteNothingOnAFailingShard: a claim or an ack of two
// shards in one call, where a key of the second is of the wrong type,
// writes nothing before it fails (every shard is read before any is
// written), so the call of the first shard alone that follows reports
// exactly what it did: the envelopes it handed out are those it leased,
// and those it buried are counted.
func TestGroupedCallsWriteNothingOnAFailingShard(t *testing.T) {
	t.Parallel()
	r := testutil.StartRedis(t)
	ctx := context.Background()
	// setUp schedules one envelope due in each of two shards and breaks
	// shard 1's key name: after claiming both first when acked.
	setUp := func(ns, name string, claimed bool) (*Store, map[string]Claimed, [2]string) {
		s := New(NewClient(Options{Addrs: []string{r.Addr}}), ns, 2, WithResendMemory(time.Hour))
		t.Cleanup(func() { s.Close() })
		ids := [2]string{idOf(s, 0, "a"), idOf(s, 1, "a")}
		schedule(t, s, Item{ID: ids[0], Absolute: true, AtMicros: 1000, Data: enc("x")},
			Item{ID: ids[1], Absolute: true, AtMicros: 1000, Data: enc("x")})
		var cl map[string]Claimed
		if claimed {
			cl = claimAll(t, s, time.Minute)
		}
		key := s.keys[1].list()[slices.Index(keyNames, name)]
		s.rdb.Del(ctx, key)
		s.rdb.Set(ctx, key, "oops", 0)
		return s, cl, ids
	}
	for _, name := range keyNames {
		s, _, _ := setUp("c"+name, name, false)
		res, _ := s.Claim(ctx, []int{0, 1}, ClaimOptions{Batch: 10, Lease: time.Minute})
		got := 0
		for _, r := range res {
			if r.Shard == 0 {
				got += len(r.Items)
			}
		}
		if leased := s.rdb.ZCard(ctx, s.keys[0].inflight).Val(); int64(got) != leased || got != 1 {
			t.Errorf("%s: the claim handed out %d of shard 0's envelope, and leased %d", name, got, leased)
		}
		s, cl, ids := setUp("a"+name, name, true)
		a, _ := s.Ack(ctx, map[int][]Settle{0: {{ID: ids[0], Token: cl[ids[0]].Token, Outcome: Bury, Error: "e"}},
			1: {{ID: ids[1], Token: cl[ids[1]].Token, Outcome: Bury, Error: "e"}}}, time.Second)
		dead := s.rdb.ZCard(ctx, s.keys[0].dead).Val() + s.rdb.ZCard(ctx, s.keys[1].dead).Val()
		if int64(a.Buried) != dead || dead == 0 {
			t.Errorf("%s: the ack reports %d buried, the shards hold %d dead", name, a.Buried, dead)
		}
	}
}

// TestClaimNamesAShardOnce: a claim that names a shard twice claims it
// once: two plans of one shard in one call would hand its envelopes out
// twice.
func TestClaimNamesAShardOnce(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	var items []Item
	for i := range 3 {
		items = append(items, Item{ID: idOf(s, 0, fmt.Sprint("d", i, "-")), Absolute: true, AtMicros: 1000, Data: enc("x")})
	}
	schedule(t, s, items...)
	res, err := s.Claim(context.Background(), []int{0, 0}, ClaimOptions{Batch: 10, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range res {
		n += len(r.Items)
	}
	if n != 3 || len(res) != 1 {
		t.Fatalf("a claim of shards [0 0] handed out %d envelopes of 3 in %d results", n, len(res))
	}
}
