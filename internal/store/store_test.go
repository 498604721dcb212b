package store

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/testutil"
	"github.com/redis/go-redis/v9"
)

func newStore(t *testing.T) (*Store, *testutil.Redis) {
	t.Helper()
	r := testutil.StartRedis(t)
	return storeOn(t, r), r
}

// storeOn is another daemon's store on r, as newStore makes it.
func storeOn(t *testing.T, r *testutil.Redis) *Store {
	t.Helper()
	s := New(NewClient(Options{Addrs: []string{r.Addr}}), "t", 4)
	t.Cleanup(func() { s.Close() })
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	// What a daemon alone with redis.due_buckets agrees on (AgreeFormats):
	// the due buckets, so the store's tests run on them.
	s.write.Store(FormatDueBuckets)
	return s
}

// count returns the sizes of one shard's sets.
func count(t *testing.T, s *Store, shard int) Counts {
	t.Helper()
	st, _, err := s.Stats(context.Background(), shard)
	if err != nil {
		t.Fatal(err)
	}
	return st[0].Counts
}

// schedule stores items and fails the test on any error. It returns each
// answer in the schedule script's own form (wire), which the tests of the
// script's semantics compare.
func schedule(t testing.TB, s *Store, items ...Item) []int64 {
	t.Helper()
	res, errs := s.Schedule(context.Background(), items)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	due := make([]int64, len(res))
	for i, r := range res {
		due[i] = wire(r)
	}
	return due
}

// wire is r as lua/schedule.lua answers it: > 0 stored at that due time,
// 0 stored before, < 0 a resend (its due time negated); -1 not written.
// Schedule reads it once (scheduledOf); TestScheduledOfWire holds the two
// together.
func wire(r Scheduled) int64 {
	switch r.Kind {
	case Stored:
		return r.DueMs
	case StoredBefore:
		return 0
	case Resend:
		return -r.DueMs
	}
	return -1
}

func TestScheduledOfWire(t *testing.T) {
	for _, due := range []int64{1, 1_700_000_000_000, 0, -1, -1_700_000_000_000} {
		if got := wire(scheduledOf(due)); got != due {
			t.Errorf("scheduledOf(%d) = %+v, back to %d", due, scheduledOf(due), got)
		}
	}
	if r := scheduledOf(0); r.Kind != StoredBefore {
		t.Errorf("0: %+v, want StoredBefore", r)
	}
	if r := scheduledOf(-5); r.Kind != Resend || r.DueMs != 5 {
		t.Errorf("-5: %+v, want Resend at 5", r)
	}
}

// settle acks or releases one claimed envelope; it returns how many settled.
func settle(t testing.TB, s *Store, c Claimed, op Outcome, retry time.Duration) int {
	t.Helper()
	ackd, err := s.Ack(context.Background(), map[int][]Settle{s.Shard(c.ID): {{ID: c.ID, Token: c.Token, Outcome: op}}}, retry)
	if err != nil {
		t.Fatal(err)
	}
	return ackd.Settled
}

// mustBeConsistent runs the read-only check on every shard.
func mustBeConsistent(t testing.TB, s *Store) {
	t.Helper()
	for sh := range s.Shards() {
		found, err := s.Check(context.Background(), sh, CheckOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(found) > 0 {
			t.Fatalf("shard %d inconsistent: %v", sh, found)
		}
	}
}

func enc(payload string) []byte {
	return envelope.Encode(envelope.Envelope{Target: "x.y", Payload: []byte(payload)})
}

// claimAll claims every shard once and returns the claimed envelopes by id.
func claimAll(t *testing.T, s *Store, lease time.Duration) map[string]Claimed {
	t.Helper()
	// Due times round up to the next ms and claims compare with the
	// current ms, so "due now" is claimable a moment later.
	time.Sleep(2 * time.Millisecond)
	got := map[string]Claimed{}
	all := make([]int, s.Shards())
	for sh := range all {
		all[sh] = sh
	}
	res, err := s.Claim(context.Background(), all, ClaimOptions{Batch: 100, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		for _, c := range r.Items {
			got[c.ID] = c
		}
	}
	return got
}

func TestScheduleClaimAck(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	due := schedule(t, s,
		Item{ID: "now", Data: enc("a")},
		Item{ID: "later", DelayMicros: int64(time.Hour / time.Microsecond), Data: enc("b")},
		Item{ID: "past", Absolute: true, AtMicros: time.Now().Add(-time.Minute).UnixMicro(), Data: enc("c")},
	)
	if due[1]-due[0] < 3599_000 {
		t.Fatalf("delay not applied: %v", due)
	}
	got := claimAll(t, s, time.Minute)
	if len(got) != 2 || got["now"].Attempt != 1 || got["past"].DueMs != due[2] {
		t.Fatalf("claimed %+v", got)
	}
	if again := claimAll(t, s, time.Minute); len(again) != 0 {
		t.Fatalf("claimed twice: %+v", again)
	}
	if n := settle(t, s, got["now"], Delivered, 0); n != 1 {
		t.Fatalf("ack settled %d", n)
	}
	if n := settle(t, s, got["now"], Delivered, 0); n != 0 {
		t.Fatalf("a resent ack settled %d", n)
	}
	counts := count(t, s, s.Shard("later"))
	if counts.Pending != 1 {
		t.Fatalf("pending %+v", counts)
	}
	mustBeConsistent(t, s)
}

func TestAckNeverDeletesNewerVersion(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	schedule(t, s, Item{ID: "o1", Data: enc("v1")})
	old := claimAll(t, s, time.Minute)["o1"]
	// Replaced while the old version is in flight.
	schedule(t, s, Item{ID: "o1", DelayMicros: 3600e6, Data: enc("v2")})
	if n := settle(t, s, old, Delivered, 0); n != 0 {
		t.Fatalf("stale ack settled %d", n)
	}
	counts := count(t, s, s.Shard("o1"))
	if counts.Pending != 1 || counts.Inflight != 0 {
		t.Fatalf("newer envelope lost: %+v", counts)
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	schedule(t, s, Item{ID: "c", DelayMicros: 3600e6, Data: enc("x")}, Item{ID: "f", Data: enc("y")})
	if c, err := s.Cancel(ctx, "c"); !c.Existed || c.InFlight || err != nil {
		t.Fatalf("cancel: %+v %v", c, err)
	}
	if c, _ := s.Cancel(ctx, "c"); c.Existed {
		t.Fatal("second cancel reported true")
	}
	// Claimed, so a delivery may be out: the reply must say so.
	claimAll(t, s, time.Minute)
	if c, err := s.Cancel(ctx, "f"); !c.Existed || !c.InFlight || err != nil {
		t.Fatalf("cancel in flight: %+v %v", c, err)
	}
	mustBeConsistent(t, s)
}

func TestExpiredLeaseReclaimedWithHigherAttempt(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	schedule(t, s, Item{ID: "r", Data: enc("x")})
	sh := s.Shard("r")
	first := claimAll(t, s, time.Millisecond)["r"]
	prev := first
	for attempt := 2; attempt <= 4; attempt++ {
		time.Sleep(5 * time.Millisecond) // let the 1 ms lease expire in Redis time
		rs, err := s.Claim(ctx, []int{sh}, ClaimOptions{Batch: 10, Lease: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		res := rs[0]
		if len(res.Items) != 1 || res.Items[0].Attempt != attempt || res.Items[0].DueMs != first.DueMs {
			t.Fatalf("attempt %d: %+v", attempt, res)
		}
		// The stale claim cannot settle, postpone or release the new one.
		for _, op := range []Outcome{Postpone, Retry, Bury, Delivered} {
			if n := settle(t, s, prev, op, 0); n != 0 {
				t.Fatalf("stale %c settled the newer claim", op)
			}
		}
		prev = res.Items[0]
	}
	mustBeConsistent(t, s)
}

// Under a backlog that fills every claim, expired leases must still come
// back (before, they were reaped only when a claim returned a short batch).
func TestExpiredLeasesNotStarvedByBacklog(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	s1 := New(s.rdb, "t", 1) // one shard: every id in it
	schedule(t, s1, Item{ID: "stuck", Absolute: true, AtMicros: 1, Data: enc("x")})
	rs, _ := s1.Claim(ctx, []int{0}, ClaimOptions{Batch: 1, Lease: time.Millisecond})
	if len(rs[0].Items) != 1 {
		t.Fatal("first claim")
	}
	var backlog []Item
	for i := range 50 {
		backlog = append(backlog, Item{ID: "b" + strconv.Itoa(i), Absolute: true, AtMicros: 1000, Data: enc("y")})
	}
	schedule(t, s1, backlog...)
	time.Sleep(5 * time.Millisecond)
	rs, err := s1.Claim(ctx, []int{0}, ClaimOptions{Batch: 10, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Items[0].ID != "stuck" || rs[0].Items[0].Attempt != 2 || len(rs[0].Items) != 10 {
		t.Fatalf("expired lease not claimed first: %+v", rs[0].Items[0])
	}
}

// Defect: a claim batch near Lua's unpack limit failed after it had removed
// the ids from due, stranding them. Every unpack is chunked now, and the
// removal comes last.
func TestClaimLargeBatchStrandsNothing(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	s1 := New(s.rdb, "t", 1)
	const n = 5000
	items := make([]Item, n)
	for i := range items {
		items[i] = Item{ID: "big" + strconv.Itoa(i), Absolute: true, AtMicros: 1, Data: enc("x")}
	}
	schedule(t, s1, items...)
	rs, err := s1.Claim(ctx, []int{0}, ClaimOptions{Batch: 4096, Lease: time.Minute})
	if err != nil {
		t.Fatalf("claim of 4096: %v", err)
	}
	if got := len(rs[0].Items); got != 4096 {
		t.Fatalf("claimed %d of 4096", got)
	}
	c := count(t, s1, 0)
	if c.Pending != n-4096 || c.Inflight != 4096 {
		t.Fatalf("counts after a big claim: %+v", c)
	}
	acks := map[int][]Settle{}
	for _, it := range rs[0].Items {
		acks[0] = append(acks[0], Settle{ID: it.ID, Token: it.Token, Outcome: Retry})
	}
	if ackd, err := s1.Ack(ctx, acks, 0); err != nil || ackd.Settled != 4096 {
		t.Fatalf("big release: %d %v", ackd.Settled, err)
	}
	mustBeConsistent(t, s1)
}

// A key of the wrong type (changed behind delayd's back) fails every script
// that touches it before it writes anything, rather than half-way
// (TestWrongTypeWritesNothing tries every key of every operation).
func TestWrongTypeFailsBeforeAnyWrite(t *testing.T) {
	t.Parallel()
	s, r := newStore(t)
	ctx := context.Background()
	s1 := New(s.rdb, "t", 1)
	schedule(t, s1, Item{ID: "w", Absolute: true, AtMicros: 1, Data: enc("x")})
	k := s1.keys[0]
	rc := r.Client()
	before := count(t, s1, 0)
	// Read by claims, written by schedules.
	saved := "{t:0}:saved"
	if err := rc.Rename(ctx, k.due, saved).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.Set(ctx, k.due, "oops", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s1.Claim(ctx, []int{0}, ClaimOptions{Batch: 10, Lease: time.Minute}); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("claim with a bad key: %v", err)
	}
	_, errs := s1.Schedule(ctx, []Item{{ID: "w2", Data: enc("y")}})
	if !errors.Is(errs[0], ErrNotWritten) {
		t.Fatalf("schedule with a bad key must be refused as not written: %v", errs[0])
	}
	if err := rc.Rename(ctx, saved, k.due).Err(); err != nil {
		t.Fatal(err)
	}
	if after := count(t, s1, 0); after != before {
		t.Fatalf("a failed script wrote: %+v -> %+v", before, after)
	}
	mustBeConsistent(t, s1)
}

func TestBuryReplayPurge(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	schedule(t, s, Item{ID: "d1", Data: enc("x")}, Item{ID: "d2", Data: enc("y")})
	got := claimAll(t, s, time.Minute)
	bury := map[int][]Settle{}
	for _, id := range []string{"d1", "d2"} {
		bury[s.Shard(id)] = append(bury[s.Shard(id)], Settle{ID: id, Token: got[id].Token, Outcome: Bury, Error: "no stream"})
	}
	if ackd, err := s.Ack(ctx, bury, time.Second); err != nil || ackd.Settled != 2 || ackd.Buried != 2 {
		t.Fatalf("bury: %+v %v", ackd, err)
	}
	e, err := s.Get(ctx, "d1")
	if err != nil || e.State != StateDead || e.Error != "no stream" || e.Attempts != 1 {
		t.Fatalf("dead entry: %+v %v", e, err)
	}
	if n, err := s.Replay(ctx, []string{"d1", "nope"}); err != nil || n != 1 {
		t.Fatalf("replay: %d %v", n, err)
	}
	again := claimAll(t, s, time.Minute)
	if c, ok := again["d1"]; !ok || c.Attempt != 2 || c.Base != 1 {
		t.Fatalf("replayed envelope must be due with the next attempt and a fresh budget: %+v", again)
	}
	if n, err := s.Purge(ctx, []string{"d1", "d2"}); err != nil || n != 1 {
		t.Fatalf("purge takes only dead ids: %d %v", n, err)
	}
	if _, err := s.Get(ctx, "d2"); err != ErrNotFound {
		t.Fatalf("purged envelope still there: %v", err)
	}
	if _, err := s.Get(ctx, "d1"); err != nil {
		t.Fatalf("purge removed a live envelope: %v", err)
	}
	mustBeConsistent(t, s)
}

func TestRelease(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	schedule(t, s, Item{ID: "rel", Data: enc("x")})
	c := claimAll(t, s, time.Minute)["rel"]
	ackd, err := s.Ack(ctx, map[int][]Settle{s.Shard("rel"): {{ID: "rel", Token: c.Token, Outcome: Retry, Error: "boom"}}}, time.Hour)
	if err != nil || ackd.Settled != 1 {
		t.Fatalf("release: %d %v", ackd.Settled, err)
	}
	rs, _ := s.Claim(ctx, []int{s.Shard("rel")}, ClaimOptions{Batch: 10, Lease: time.Minute})
	if res := rs[0]; len(res.Items) != 0 || res.NextDueMs < res.NowMs()+3000_000 {
		t.Fatalf("released envelope must wait for the retry delay: %+v", rs[0])
	}
}

func TestNoScriptReload(t *testing.T) {
	t.Parallel()
	s, r := newStore(t)
	ctx := context.Background()
	if err := r.Client().ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	schedule(t, s, Item{ID: "a", Data: enc("x")}, Item{ID: "b", Data: enc("y")})
	_ = r.Client().ScriptFlush(ctx).Err()
	if got := claimAll(t, s, time.Minute); len(got) != 2 {
		t.Fatalf("claim after SCRIPT FLUSH: %+v", got)
	}
}

// One Ack call that settles an id twice (or replay and purge naming an id
// twice) counts it once and leaves the data consistent, as two calls would.
func TestRepeatedIDsInOneCall(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	for _, pair := range [][2]Outcome{{Delivered, Retry}, {Retry, Delivered}, {Bury, Retry}, {Postpone, Postpone}} {
		id := "x" + string(pair[0]) + string(pair[1])
		schedule(t, s, Item{ID: id, Absolute: true, AtMicros: 1, Data: enc("x")})
		c := claimAll(t, s, time.Minute)[id]
		ackd, err := s.Ack(ctx, map[int][]Settle{s.Shard(id): {
			{ID: id, Token: c.Token, Outcome: pair[0]}, {ID: id, Token: c.Token, Outcome: pair[1]}}}, time.Hour)
		if err != nil || ackd.Settled != 1 {
			t.Fatalf("%c then %c: settled %d (%v), want 1", pair[0], pair[1], ackd.Settled, err)
		}
		mustBeConsistent(t, s)
	}
	schedule(t, s, Item{ID: "dd", Absolute: true, AtMicros: 1, Data: enc("x")})
	c := claimAll(t, s, time.Minute)["dd"]
	settle(t, s, c, Bury, 0)
	if n, err := s.Replay(ctx, []string{"dd", "dd"}); err != nil || n != 1 {
		t.Fatalf("replay of a repeated id: %d %v", n, err)
	}
	c = claimAll(t, s, time.Minute)["dd"]
	settle(t, s, c, Bury, 0)
	if n, err := s.Purge(ctx, []string{"dd", "dd"}); err != nil || n != 1 {
		t.Fatalf("purge of a repeated id: %d %v", n, err)
	}
	mustBeConsistent(t, s)
}

// Credentials in a redis:// address go to the client options, never into
// the address that dial errors, logs and /readyz show.
func TestRedisURLCredentials(t *testing.T) {
	t.Parallel()
	r := testutil.StartRedis(t)
	if err := r.Client().ConfigSet(context.Background(), "requirepass", "TOPSECRET").Err(); err != nil {
		t.Fatal(err)
	}
	c := NewClient(Options{Addrs: []string{"redis://:TOPSECRET@" + r.Addr + "/0"}})
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("password from the URL not used: %v", err)
	}
	bad := NewClient(Options{Addrs: []string{"redis://:TOPSECRET@127.0.0.1:1"}})
	defer bad.Close()
	if err := bad.Ping(context.Background()).Err(); err == nil || strings.Contains(err.Error(), "TOPSECRET") {
		t.Fatalf("dial error shows the password: %v", err)
	}
}

// Redis URLs in any case, without a port, with an IPv6 host: the address
// is host:port, the TLS name the host, and no credentials anywhere.
func TestRedisURLForms(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"REDIS://u:secret@127.0.0.1:1/0": "127.0.0.1:1",
		"redis://u:secret@127.0.0.1/0":   "127.0.0.1:6379",
		"rediss://u:p@[::1]:6380/2":      "[::1]:6380",
	} {
		c := NewClient(Options{Addrs: []string{in}})
		o := c.(*redis.Client).Options()
		c.Close()
		if o.Addr != want || strings.Contains(o.Addr, "secret") {
			t.Errorf("%s: address %q, want %q", in, o.Addr, want)
		}
		if o.TLSConfig != nil && o.TLSConfig.ServerName != strings.Trim(strings.Split(want, "]")[0], "[") {
			t.Errorf("%s: TLS name %q", in, o.TLSConfig.ServerName)
		}
	}
}

// TestSeriesNextOccurrence: an ack with the next due time moves a series to
// its next occurrence in the same script: due then, occurrence + 1, fresh
// attempts, the same data. A stale settle of an earlier claim changes
// nothing, and a replace starts the series over at occurrence 1.
func TestSeriesNextOccurrence(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Now()
	schedule(t, s, Item{ID: "s1", Absolute: true, AtMicros: now.Add(-time.Second).UnixMicro(), Series: true, Data: enc("tick")})
	c := claimAll(t, s, time.Minute)["s1"]
	if c.Occurrence != 1 || c.Attempt != 1 || string(c.Data) != string(enc("tick")) {
		t.Fatalf("first claim: %+v", c)
	}
	// A release first: the occurrence is retried, not advanced.
	if settle(t, s, c, Retry, 0) != 1 {
		t.Fatal("release not settled")
	}
	c = claimAll(t, s, time.Minute)["s1"]
	if c.Occurrence != 1 || c.Attempt != 2 {
		t.Fatalf("retried occurrence: %+v", c)
	}
	next := now.Add(time.Hour).UnixMilli()
	ackd, err := s.Ack(ctx, map[int][]Settle{s.Shard("s1"): {{ID: "s1", Token: c.Token, Outcome: Next, NextDueMs: next}}}, 0)
	if err != nil || ackd.Settled != 1 {
		t.Fatalf("next: %d, %v", ackd.Settled, err)
	}
	// Resent, the same settle must not advance it twice.
	if ackd, _ := s.Ack(ctx, map[int][]Settle{s.Shard("s1"): {{ID: "s1", Token: c.Token, Outcome: Next, NextDueMs: next + 1000}}}, 0); ackd.Settled != 0 {
		t.Fatalf("a resent next settled %d", ackd.Settled)
	}
	e, err := s.Get(ctx, "s1")
	if err != nil || e.State != StatePending || e.DueMs != next || e.Occurrence != 2 || e.Attempts != 0 ||
		string(e.Data) != string(enc("tick")) {
		t.Fatalf("after next: %+v, %v", e, err)
	}
	mustBeConsistent(t, s)
	c2 := claimAt(t, s, "s1")
	if c2.Occurrence != 2 || c2.Attempt != 1 || c2.DueMs != next {
		t.Fatalf("second occurrence: %+v", c2)
	}
	// A replace starts the series over.
	schedule(t, s, Item{ID: "s1", Absolute: true, AtMicros: now.Add(-time.Second).UnixMicro(), Series: true, Data: enc("tock")})
	c3 := claimAll(t, s, time.Minute)["s1"]
	if c3.Occurrence != 1 || c3.Attempt != 1 || string(c3.Data) != string(enc("tock")) {
		t.Fatalf("after replace: %+v", c3)
	}
	if settle(t, s, c2, Delivered, 0) != 0 {
		t.Fatal("the replaced occurrence's ack settled the new series")
	}
	mustBeConsistent(t, s)
}

// claimAt makes id due now by lowering its score with a direct ZADD (the
// test would otherwise wait for the next occurrence) and claims it; the
// due time a claim reports comes from the value header, not the score.
func claimAt(t *testing.T, s *Store, id string) Claimed {
	t.Helper()
	k := s.keys[s.Shard(id)]
	if err := s.rdb.ZAdd(context.Background(), k.due, redis.Z{Score: 1, Member: id}).Err(); err != nil {
		t.Fatal(err)
	}
	return claimAll(t, s, time.Minute)[id]
}

// TestEmptyValueDoesNotStopTheShard: a data value emptied behind delayd's
// back is handed out (its delivery fails to decode and it ends dead), and
// the claim of the rest of its shard goes on.
func TestEmptyValueDoesNotStopTheShard(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	schedule(t, s, Item{ID: "e1", Absolute: true, AtMicros: 1000, Data: enc("x")})
	if err := s.rdb.HSet(ctx, s.keys[s.Shard("e1")].data, "e1", "").Err(); err != nil {
		t.Fatal(err)
	}
	c, ok := claimAll(t, s, time.Minute)["e1"]
	if !ok || len(c.Data) != 0 || c.DueMs != -1 {
		t.Fatalf("claim: %+v, %v", c, ok)
	}
	if settle(t, s, c, Bury, 0) != 1 {
		t.Fatal("not buried")
	}
	if n, err := s.Replay(ctx, []string{"e1"}); err != nil || n != 1 {
		t.Fatalf("replay: %d, %v", n, err)
	}
}
