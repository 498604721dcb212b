package store

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestTokensNeverRepeat: an envelope claimed, replaced by a version due at
// once and claimed again with a lease that ends in the same millisecond,
// with the same hint: the old claim's token must not be the new one's, and
// the old delivery's ack must leave the new version alone. Under the
// scheme before (the token was the hint), the two claims shared a token
// and the stale ack deleted the new version.
func TestTokensNeverRepeat(t *testing.T) {
	t.Parallel()
	r, _ := newStore(t)
	s := New(r.rdb, "t", 4, WithTokenHint(func() int { return 500 }))
	ctx := context.Background()
	same := 0
	for i := 0; i < 200 && same < 20; i++ {
		schedule(t, s, Item{ID: "x", Absolute: true, AtMicros: 1000, Data: enc("v1")})
		first := claimOnly(t, s, "x", time.Minute)
		start := time.Now()
		schedule(t, s, Item{ID: "x", Absolute: true, AtMicros: 1000, Data: enc("v2")})
		second := claimOnly(t, s, "x", time.Minute-time.Since(start).Truncate(time.Millisecond))
		if first.Token == second.Token {
			t.Fatalf("two claims of one id got the same token %s", first.Token)
		}
		if mustInt(t, first.Token)/1000 == mustInt(t, second.Token)/1000 {
			same++ // the two leases end in the same millisecond
		}
		if settle(t, s, first, Delivered, 0) != 0 {
			t.Fatal("the replaced version's ack settled the new claim")
		}
		e, err := s.Get(ctx, "x")
		if err != nil || e.State != StateInflight || !strings.Contains(string(e.Data), "v2") {
			t.Fatalf("the new version after the stale ack: %+v %v", e, err)
		}
		if settle(t, s, second, Delivered, 0) != 1 {
			t.Fatal("the new claim did not settle")
		}
	}
	if same == 0 {
		t.Fatal("no two leases ended in the same millisecond: the test proved nothing")
	}
	mustBeConsistent(t, s)
}

// claimOnly claims id's shard and returns id's claim.
func claimOnly(t *testing.T, s *Store, id string, lease time.Duration) Claimed {
	t.Helper()
	res, err := s.Claim(context.Background(), []int{s.Shard(id)}, ClaimOptions{Batch: 10, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range res[0].Items {
		if c.ID == id {
			return c
		}
	}
	t.Fatalf("%s not claimed: %+v", id, res)
	return Claimed{}
}

// TestAttemptsOnlyGoUp: retries, a death, a replay and a lease expiry
// each carry the next attempt; a replay grants a fresh budget.
func TestAttemptsOnlyGoUp(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	schedule(t, s, Item{ID: "a", Absolute: true, AtMicros: 1000, Data: enc("x")})
	c := claimOnly(t, s, "a", time.Minute)
	if c.Attempt != 1 || c.Base != 0 {
		t.Fatalf("first claim: %+v", c)
	}
	settle(t, s, c, Retry, 0)
	c = claimOnly(t, s, "a", time.Minute)
	if c.Attempt != 2 || c.Base != 0 {
		t.Fatalf("after a retry: %+v", c)
	}
	settle(t, s, c, Bury, 0)
	if n, err := s.Replay(ctx, []string{"a"}); err != nil || n != 1 {
		t.Fatalf("replay: %d %v", n, err)
	}
	if e, _ := s.Get(ctx, "a"); e.Attempts != 2 {
		t.Fatalf("replayed envelope shows %d attempts, want 2", e.Attempts)
	}
	c = claimOnly(t, s, "a", 0)
	if c.Attempt != 3 || c.Base != 2 {
		t.Fatalf("after a replay: %+v", c)
	}
	// Its lease (0) expires: the re-claim counts it.
	time.Sleep(2 * time.Millisecond)
	c = claimOnly(t, s, "a", time.Minute)
	if c.Attempt != 4 || c.Base != 2 {
		t.Fatalf("after a lease expiry: %+v", c)
	}
	settle(t, s, c, Postpone, 0)
	c = claimOnly(t, s, "a", time.Minute)
	if c.Attempt != 4 || c.Base != 2 {
		t.Fatalf("after a postpone (the attempt given back): %+v", c)
	}
	settle(t, s, c, Bury, 0)
	if n, _ := s.Replay(ctx, []string{"a"}); n != 1 {
		t.Fatal("second replay")
	}
	if c = claimOnly(t, s, "a", time.Minute); c.Attempt != 5 || c.Base != 4 {
		t.Fatalf("after a second replay: %+v", c)
	}
	mustBeConsistent(t, s)
}

// TestRetryDelayPerSettle: a settle's own retry delay replaces the call's.
func TestRetryDelayPerSettle(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	schedule(t, s, Item{ID: "r1", Absolute: true, AtMicros: 1000, Data: enc("x")},
		Item{ID: "r2", Absolute: true, AtMicros: 1000, Data: enc("y")})
	got := claimAll(t, s, time.Minute)
	sts := map[int][]Settle{}
	sts[s.Shard("r1")] = append(sts[s.Shard("r1")], Settle{ID: "r1", Token: got["r1"].Token, Outcome: Retry, RetryDelay: time.Hour})
	sts[s.Shard("r2")] = append(sts[s.Shard("r2")], Settle{ID: "r2", Token: got["r2"].Token, Outcome: Retry})
	start := time.Now()
	ackd, err := s.Ack(ctx, sts, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// The two shards' settles are two script calls, each reading Redis'
	// clock; NowMs is one of them. They ran within the Ack call, which on
	// a loaded machine can span milliseconds (4 ms in one CI run).
	slack := time.Since(start).Milliseconds() + 1
	now := ackd.NowMs
	e1, _ := s.Get(ctx, "r1")
	e2, _ := s.Get(ctx, "r2")
	near := func(got, want int64) bool { return got >= want-slack && got <= want+slack }
	if !near(e1.DueMs, now+time.Hour.Milliseconds()) || !near(e2.DueMs, now+1000) {
		t.Fatalf("due %d and %d, want %d and %d (±%d ms, the Ack call's time)", e1.DueMs, e2.DueMs, now+time.Hour.Milliseconds(), now+1000, slack)
	}
}

// TestStreamMessageStoredOnce: a stream message stored once is not stored
// again within the memory, even after it was delivered and deleted; a new
// message for the same id replaces as before; after the memory it is a
// new message again.
func TestStreamMessageStoredOnce(t *testing.T) {
	t.Parallel()
	r, _ := newStore(t)
	s := New(r.rdb, "t", 4, WithStreamMemory(300*time.Millisecond))
	ctx := context.Background()
	msg := Item{ID: "m", Absolute: true, AtMicros: 1000, Data: enc("v1"), StreamMsg: "7@1700000000000000000"}
	if due := schedule(t, s, msg); due[0] != 1 {
		t.Fatalf("first delivery of the message: due %d", due[0])
	}
	settle(t, s, claimOnly(t, s, "m", time.Minute), Delivered, 0)
	if due := schedule(t, s, msg); due[0] != 0 {
		t.Fatalf("a redelivery of a message stored and delivered: due %d, want 0 (not stored)", due[0])
	}
	if _, err := s.Get(ctx, "m"); err != ErrNotFound {
		t.Fatalf("the redelivery was stored: %v", err)
	}
	next := Item{ID: "m", Absolute: true, AtMicros: 2000, Data: enc("v2"), StreamMsg: "8@1700000000000000001"}
	if due := schedule(t, s, next); due[0] != 2 {
		t.Fatalf("a new message for the id: due %d", due[0])
	}
	if due := schedule(t, s, next, next); due[0] != 0 || due[1] != 0 {
		t.Fatalf("the same message twice more in one batch: %v", due)
	}
	time.Sleep(400 * time.Millisecond)
	if due := schedule(t, s, msg); due[0] != 1 {
		t.Fatalf("after the memory: due %d, want it stored", due[0])
	}
	mustBeConsistent(t, s)
}

// TestFormatsOfAMixedFleet: a daemon that meets a value of a format newer
// than it reads gives it back untouched and uncounted; the newer daemon
// writes the older format while the older one is alive, the newer one
// after it left, and delivers both.
func TestFormatsOfAMixedFleet(t *testing.T) {
	t.Parallel()
	r, _ := newStore(t)
	ctx := context.Background()
	older := New(r.rdb, "t", 4)
	newer := New(r.rdb, "t", 4, WithNewestFormat(formatNext))
	agree := func(s *Store, id string, want int) {
		t.Helper()
		if got, err := s.AgreeFormats(ctx, id, time.Minute); err != nil || got != want {
			t.Fatalf("%s writes format %d (%v), want %d", id, got, err, want)
		}
	}
	agree(older, "old", newestFormat)
	agree(newer, "new", newestFormat)
	schedule(t, newer, Item{ID: "f2", Absolute: true, AtMicros: 1000, Data: enc("two")})
	if _, err := older.AgreeFormats(ctx, "old", 0); err != nil {
		t.Fatal(err)
	}
	agree(newer, "new", formatNext)
	schedule(t, newer, Item{ID: "f3", Absolute: true, AtMicros: 1000, Data: enc("three")},
		Item{ID: "d3", DelayMicros: 0, Data: enc("delay")})
	k := older.keys[older.Shard("f3")]
	before, _ := r.rdb.HGet(ctx, k.data, "f3").Result()
	if formatOf(before) != formatNext {
		t.Fatalf("the newer daemon alone wrote format %d", formatOf(before))
	}

	// The older daemon meets f3 and d3: both stay, uncounted.
	time.Sleep(2 * time.Millisecond)
	var unknown int
	got := map[string]Claimed{}
	for sh := range 4 {
		res, err := older.Claim(ctx, []int{sh}, ClaimOptions{Batch: 10, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		unknown += res[0].Unknown
		if res[0].Unknown > 0 && res[0].UnknownFormat != formatNext {
			t.Fatalf("unknown format reported as %d", res[0].UnknownFormat)
		}
		for _, c := range res[0].Items {
			got[c.ID] = c
		}
	}
	if unknown != 2 || len(got) != 1 || got["f2"].ID == "" {
		t.Fatalf("the older daemon claimed %v and gave back %d, want only f2 and 2 given back", got, unknown)
	}
	after, _ := r.rdb.HGet(ctx, k.data, "f3").Result()
	if after != before {
		t.Fatal("the older daemon rewrote a value of a newer format")
	}
	for _, id := range []string{"f3", "d3"} {
		e, err := older.Get(ctx, id)
		if err != nil || e.State != StatePending || e.Attempts != 0 {
			t.Fatalf("%s after the older daemon's claim: %+v %v", id, e, err)
		}
	}
	// The newer daemon delivers them, a second later.
	time.Sleep(1100 * time.Millisecond)
	got = map[string]Claimed{}
	for sh := range 4 {
		res, err := newer.Claim(ctx, []int{sh}, ClaimOptions{Batch: 10, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range res[0].Items {
			got[c.ID] = c
		}
	}
	if got["f3"].Attempt != 1 || string(got["f3"].Data) != string(enc("three")) || got["f3"].DueMs != 1 ||
		got["d3"].Attempt != 1 || string(got["d3"].Data) != string(enc("delay")) {
		t.Fatalf("the newer daemon's claim: %+v", got)
	}
	mustBeConsistent(t, newer)
}

// TestClaimBytes: a claim hands out what fits in its share of the budget,
// one shard per claim its first envelope even when that alone is larger,
// and leaves the rest due for the next claim; over many shards a claim
// holds at most its budget plus one payload.
func TestClaimBytes(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	var ids []string
	for i := 0; len(ids) < 10; i++ {
		if id := "b" + strconv.Itoa(i); s.Shard(id) == 0 {
			ids = append(ids, id)
			schedule(t, s, Item{ID: id, Absolute: true, AtMicros: int64(1000 * (len(ids))), Data: make([]byte, 993)})
		}
	}
	claim := func(bytes int64) []Claimed {
		t.Helper()
		res, err := s.Claim(ctx, []int{0}, ClaimOptions{Batch: 100, Lease: time.Minute, Bytes: bytes})
		if err != nil {
			t.Fatal(err)
		}
		return res[0].Items
	}
	// Values are 1000 bytes (a 7-byte header), over a sixteenth of the
	// budget, so large: two fit in the three quarters of 2700 large
	// values may take.
	if got := claim(2700); len(got) != 2 || got[0].ID != ids[0] || got[1].ID != ids[1] {
		t.Fatalf("claim of 2700 bytes: %d envelopes %v", len(got), claimedIDs(got))
	}
	if got := claim(1); len(got) != 1 || got[0].ID != ids[2] {
		t.Fatalf("a budget below one envelope must still hand out one: %v", claimedIDs(got))
	}
	if got := claim(0); len(got) != 7 {
		t.Fatalf("no budget: %d envelopes, want the 7 left", len(got))
	}
	// One envelope of 1000 bytes in each of the 4 shards, a budget of 100:
	// each claim hands out exactly one, from the shard whose turn it is,
	// and four claims hand out all four.
	for sh := range 4 {
		for i := 0; ; i++ {
			if id := "o" + strconv.Itoa(sh) + "-" + strconv.Itoa(i); s.Shard(id) == sh {
				schedule(t, s, Item{ID: id, Absolute: true, AtMicros: 1000, Data: make([]byte, 993)})
				break
			}
		}
	}
	seen := map[string]bool{}
	for range 4 {
		res, err := s.Claim(ctx, []int{0, 1, 2, 3}, ClaimOptions{Batch: 100, Lease: time.Minute, Bytes: 100})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range res {
			for _, c := range r.Items {
				n++
				seen[c.ID] = true
			}
		}
		if n != 1 {
			t.Fatalf("a claim over 4 shards with a budget below one envelope handed out %d, want 1", n)
		}
	}
	if len(seen) != 4 {
		t.Fatalf("four claims handed out %v, want one of each shard", seen)
	}
	mustBeConsistent(t, s)
}

// TestReplayGrantsAFreshBudget: a replay keeps the count and grants a
// fresh budget ("n/n").
func TestReplayGrantsAFreshBudget(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	rdb := s.rdb
	k := s.keys[s.Shard("x")]
	schedule(t, s, Item{ID: "x", Absolute: true, AtMicros: 1000, Data: enc("x")})
	rdb.ZRem(ctx, k.due, "x")
	rdb.ZAdd(ctx, k.dead, redis.Z{Score: 1, Member: "x"})
	rdb.HSet(ctx, k.attempts, "x", "3")
	if _, _, err := s.Heartbeat(ctx, "new", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AgreeFormats(ctx, "new", time.Minute); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Replay(ctx, []string{"x"}); err != nil || n != 1 {
		t.Fatalf("replay with every member announcing: %d, %v", n, err)
	}
	if a := rdb.HGet(ctx, k.attempts, "x").Val(); a != "3/3" {
		t.Fatalf("attempts after a replay: %q, want 3/3", a)
	}
}

// TestClaimTakesSmallPastLarge: envelopes that do not fit in a shard's
// share are skipped, not a wall: small ones due after them go out in the
// same claim, from a quarter of the share kept for small values even in a
// shard that handed out an envelope larger than its share. What was
// skipped stays due, first in line for the next claim.
func TestClaimTakesSmallPastLarge(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	idIn := func(prefix string, shard int) string { return idInShard(s, prefix, shard) }
	// Per shard: two values of 30,000 bytes due first, then three of 100.
	const share = 50000
	var large, small [2][]string
	for sh := range 2 {
		for i := range 2 {
			id := idIn("L"+strconv.Itoa(i)+"-", sh)
			large[sh] = append(large[sh], id)
			schedule(t, s, Item{ID: id, Absolute: true, AtMicros: int64(1000 + i), Data: make([]byte, 30000-7)})
		}
		for i := range 3 {
			id := idIn("s"+strconv.Itoa(i)+"-", sh)
			small[sh] = append(small[sh], id)
			schedule(t, s, Item{ID: id, Absolute: true, AtMicros: int64(2000 + i), Data: make([]byte, 100-7)})
		}
	}
	res, err := s.Claim(ctx, []int{0, 1}, ClaimOptions{Batch: 100, Lease: time.Minute, Bytes: 2 * share})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		got := claimedIDs(r.Items)
		// One large fits in the share, the second does not (60,000 >
		// the three quarters of 50,000 large ones may take): skipped, and
		// the three small ones still go out.
		want := []string{large[r.Shard][0], small[r.Shard][0], small[r.Shard][1], small[r.Shard][2]}
		if !slices.Equal(got, want) {
			t.Fatalf("shard %d claim: %v, want %v (small ones past the large one that did not fit)", r.Shard, got, want)
		}
	}
	// The skipped ones are still due, and are next.
	res, err = s.Claim(ctx, []int{0, 1}, ClaimOptions{Batch: 100, Lease: time.Minute, Bytes: 2 * share})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if got := claimedIDs(r.Items); !slices.Equal(got, []string{large[r.Shard][1]}) {
			t.Fatalf("shard %d second claim: %v, want the skipped %s", r.Shard, got, large[r.Shard][1])
		}
	}
	mustBeConsistent(t, s)

	// A shard whose turn hands out a value larger than its share still
	// hands out the small ones behind it, from the quarter kept for them.
	big := idIn("B", 2)
	schedule(t, s, Item{ID: big, Absolute: true, AtMicros: 3000, Data: make([]byte, 200000)})
	var tiny []string
	for i := range 3 {
		id := idIn("t"+strconv.Itoa(i)+"-", 2)
		tiny = append(tiny, id)
		schedule(t, s, Item{ID: id, Absolute: true, AtMicros: int64(3001 + i), Data: make([]byte, 100-7)})
	}
	res, err = s.Claim(ctx, []int{2}, ClaimOptions{Batch: 100, Lease: time.Minute, Bytes: share})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := claimedIDs(res[0].Items), append([]string{big}, tiny...); !slices.Equal(got, want) {
		t.Fatalf("oversize turn: %v, want %v", got, want)
	}
	mustBeConsistent(t, s)
}

// TestClaimSizesTheFirstValue: a shard whose due ids begin with large
// values reads none of them in a multi-value HMGET: the first value is
// sized before any is read (one HSTRLEN a shard a claim), and from then
// on each is sized, and read alone only when it fits. Before, the first
// HMGET read four values whatever their size, which with 900 kB values
// took longer than the rest of the claim and held back the small
// envelopes due beside them (BenchmarkSmallBesideLarge). A shard of
// small values still reads them four, then sixteen at a time.
func TestClaimSizesTheFirstValue(t *testing.T) {
	t.Parallel()
	s, r := newStore(t)
	ctx := context.Background()
	rc := r.Client()
	idIn := func(prefix string, shard int) string { return idInShard(s, prefix, shard) }
	var ids []string
	for i, size := range []int{30000, 30000, 100, 100, 100} {
		id := idIn("v"+strconv.Itoa(i)+"-", 0)
		ids = append(ids, id)
		schedule(t, s, Item{ID: id, Absolute: true, AtMicros: int64(1000 + i), Data: make([]byte, size-7)})
	}
	hmget, hget, hstrlen := commandCalls(t, rc, "hmget"), commandCalls(t, rc, "hget"), commandCalls(t, rc, "hstrlen")
	// A share of 10,000: the first large value goes out on the shard's
	// oversize turn, the second is skipped unread.
	res, err := s.Claim(ctx, []int{0}, ClaimOptions{Batch: 100, Lease: time.Minute, Bytes: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := claimedIDs(res[0].Items), []string{ids[0], ids[2], ids[3], ids[4]}; !slices.Equal(got, want) {
		t.Fatalf("claimed %v, want %v", got, want)
	}
	if n := commandCalls(t, rc, "hmget") - hmget; n != 0 {
		t.Errorf("%d HMGETs read values before they were sized", n)
	}
	if n := commandCalls(t, rc, "hget") - hget; n != 4 {
		t.Errorf("%d HGETs, want 4: the values handed out, one each", n)
	}
	if n := commandCalls(t, rc, "hstrlen") - hstrlen; n != 5 {
		t.Errorf("%d HSTRLENs, want 5: every value sized once", n)
	}

	// Small values only: one HSTRLEN, then HMGETs of four and sixteen.
	for i := range 12 {
		schedule(t, s, Item{ID: idIn("w"+strconv.Itoa(i)+"-", 1), Absolute: true, AtMicros: int64(2000 + i), Data: make([]byte, 50)})
	}
	hmget, hstrlen = commandCalls(t, rc, "hmget"), commandCalls(t, rc, "hstrlen")
	if res, err = s.Claim(ctx, []int{1}, ClaimOptions{Batch: 100, Lease: time.Minute, Bytes: 10000}); err != nil || len(res[0].Items) != 12 {
		t.Fatalf("claim of small values: %v, %v", res, err)
	}
	if n := commandCalls(t, rc, "hmget") - hmget; n != 2 {
		t.Errorf("%d HMGETs for 12 small values, want 2 (four, then sixteen)", n)
	}
	if n := commandCalls(t, rc, "hstrlen") - hstrlen; n != 1 {
		t.Errorf("%d HSTRLENs for small values, want the one probe", n)
	}
	mustBeConsistent(t, s)
}

// TestClaimSizesEveryValueOnAShardWithLargeOnes: large values behind a
// small first one are not read in an HMGET either, on a shard known to
// hold them: from the due time of a large value this store scheduled,
// or after a claim met one (the review of d6c8d01: four small values in
// front of sixteen of 900 kB held Redis 442-474 ms in one claim).
func TestClaimSizesEveryValueOnAShardWithLargeOnes(t *testing.T) {
	t.Parallel()
	s, r := newStore(t)
	ctx := context.Background()
	rc := r.Client()
	other := storeOn(t, r)
	idIn := func(prefix string, shard int) string { return idInShard(s, prefix, shard) }
	// In shard sh, due in this order: small, large, large, small, small.
	fill := func(st *Store, sh int, tag string, at int64) []string {
		var ids []string
		for i, size := range []int{100, 30000, 30000, 100, 100} {
			id := idIn(tag+strconv.Itoa(i)+"-", sh)
			ids = append(ids, id)
			schedule(t, st, Item{ID: id, Absolute: true, AtMicros: at + int64(i), Data: make([]byte, size-7)})
		}
		return ids
	}
	claim := func(st *Store, sh int) (ids []string, hmgets int) {
		before := commandCalls(t, rc, "hmget")
		res, err := st.Claim(ctx, []int{sh}, ClaimOptions{Batch: 100, Lease: time.Minute, Bytes: 100000})
		if err != nil {
			t.Fatal(err)
		}
		return claimedIDs(res[0].Items), commandCalls(t, rc, "hmget") - before
	}
	// Scheduled by this store: it knows, and reads no value unsized.
	ids := fill(s, 0, "a", 1000)
	if got, n := claim(s, 0); !slices.Equal(got, ids) || n != 0 {
		t.Fatalf("shard this store filled: claimed %v with %d HMGETs, want all 5 with none", got, n)
	}
	// Scheduled by another daemon: the first claim finds out (its HMGET
	// reads them), the next one sizes every value.
	fill(other, 1, "b", 2000)
	if _, n := claim(s, 1); n == 0 {
		t.Fatal("a claim on a shard not known to hold large values sized every value (the test needs it not to)")
	}
	fill(other, 1, "c", 3000)
	if got, n := claim(s, 1); len(got) != 5 || n != 0 {
		t.Fatalf("the claim after one met large values: %v with %d HMGETs, want 5 with none", got, n)
	}
	// A shard of small values only stays on HMGETs.
	for i := range 6 {
		schedule(t, s, Item{ID: idIn("d"+strconv.Itoa(i)+"-", 2), Absolute: true, AtMicros: int64(4000 + i), Data: make([]byte, 50)})
	}
	if got, n := claim(s, 2); len(got) != 6 || n == 0 {
		t.Fatalf("small values only: %v with %d HMGETs", got, n)
	}
	mustBeConsistent(t, s)
}

// idInShard is the first id prefix+n (n = 0, 1, ...) in shard.
func idInShard(s *Store, prefix string, shard int) string {
	for i := 0; ; i++ {
		if id := prefix + strconv.Itoa(i); s.Shard(id) == shard {
			return id
		}
	}
}
