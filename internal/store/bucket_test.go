package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/delayd/delayd/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// bucketStore is a store of one shard whose fleet (itself) writes format 4:
// new envelopes go to the due buckets (keys.go, pending).
func bucketStore(t *testing.T) (*Store, *redis.Client) {
	t.Helper()
	r, _ := newStore(t)
	s := New(r.rdb, "b", 1, WithNewestFormat(FormatDueBuckets))
	if w, err := s.AgreeFormats(context.Background(), "me", time.Minute); err != nil || w != FormatDueBuckets {
		t.Fatalf("writes format %d (%v), want %d", w, err, FormatDueBuckets)
	}
	return s, r.rdb.(*redis.Client)
}

// bucketsOf returns shard 0's buckets: bound member → their entries' ids
// in order, and the encoding of each.
func bucketsOf(t *testing.T, s *Store, rc *redis.Client) (members []string, ids map[string][]string, enc map[string]string) {
	t.Helper()
	ctx := context.Background()
	k := s.keys[0]
	members, err := rc.ZRange(ctx, k.pending, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	ids, enc = map[string][]string{}, map[string]string{}
	for _, m := range members {
		ids[m] = rc.ZRange(ctx, k.pending+":"+m, 0, -1).Val()
		enc[m] = rc.ObjectEncoding(ctx, k.pending+":"+m).Val()
	}
	return members, ids, enc
}

// TestBucketsSplit: the due buckets split past bucketMax, every bucket is
// a listpack, nothing goes to the due set, and Stats counts them.
func TestBucketsSplit(t *testing.T) {
	t.Parallel()
	s, rc := bucketStore(t)
	ctx := context.Background()
	const n = 1000
	var items []Item
	for i := range n {
		// Spread over 10 s, not in id order.
		at := time.Now().Add(time.Hour + time.Duration((i*7919)%n)*10*time.Millisecond)
		items = append(items, Item{ID: fmt.Sprintf("id%04d", i), Absolute: true, AtMicros: at.UnixMicro(), Data: enc("x")})
	}
	schedule(t, s, items[:n/2]...)
	for _, it := range items[n/2:] {
		schedule(t, s, it)
	}
	members, ids, encs := bucketsOf(t, s, rc)
	if len(members) < n/(bucketMax+1) {
		t.Fatalf("%d buckets for %d entries", len(members), n)
	}
	total := 0
	for _, m := range members {
		if len(ids[m]) == 0 || len(ids[m]) > bucketMax+1 || encs[m] != "listpack" {
			t.Fatalf("bucket %s: %d entries, %s", m, len(ids[m]), encs[m])
		}
		total += len(ids[m])
	}
	if total != n || rc.ZCard(ctx, s.keys[0].due).Val() != 0 {
		t.Fatalf("%d entries in buckets, %d in due", total, rc.ZCard(ctx, s.keys[0].due).Val())
	}
	if c := count(t, s, 0); c.Pending != n {
		t.Fatalf("Stats counts %d pending", c.Pending)
	}
	mustBeConsistent(t, s)
}

// claimEvery claims shard 0 in batches of batch until nothing is due, and
// returns what it claimed, in order; every claim must hand out only what
// is due at its own time.
func claimEvery(t *testing.T, s *Store, batch int) []Claimed {
	t.Helper()
	var out []Claimed
	for {
		res, err := s.Claim(context.Background(), []int{0}, ClaimOptions{Batch: batch, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range res[0].Items {
			if c.DueMs > res[0].NowMs() {
				t.Fatalf("%s claimed early: due %d, now %d", c.ID, c.DueMs, res[0].NowMs())
			}
		}
		if len(res[0].Items) == 0 {
			return out
		}
		out = append(out, res[0].Items...)
	}
}

// inOrder fails unless cs are in (due, id) order.
func inOrder(t *testing.T, cs []Claimed) {
	t.Helper()
	for i := 1; i < len(cs); i++ {
		a, b := cs[i-1], cs[i]
		if a.DueMs > b.DueMs || a.DueMs == b.DueMs && a.ID > b.ID {
			t.Fatalf("claimed %s (due %d) before %s (due %d)", a.ID, a.DueMs, b.ID, b.DueMs)
		}
	}
}

// TestBucketTies: ids due in one ms stay in one bucket (buckets split
// between due times, never inside one), which holds more than bucketMax of
// them when it must; cancel and replace find them, and a claim takes them
// in (due, id) order.
func TestBucketTies(t *testing.T) {
	t.Parallel()
	s, rc := bucketStore(t)
	ctx := context.Background()
	at := time.Now().Add(-time.Second).UnixMicro()
	var items []Item
	for i := range 1000 {
		// 70 ids in each of 10 ms, 300 in the last, in no order.
		j := (i * 7919) % 1000
		ms := min(j/70, 10)
		items = append(items, Item{ID: fmt.Sprintf("t%05d", j), Absolute: true, AtMicros: at + int64(ms)*1000, Data: enc("x")})
	}
	schedule(t, s, items[:500]...)
	for _, it := range items[500:] {
		schedule(t, s, it)
	}
	members, ids, encs := bucketsOf(t, s, rc)
	if len(members) < 6 {
		t.Fatalf("%d buckets", len(members))
	}
	for _, m := range members {
		// 70 or 300 ids due in one ms: in one bucket, a listpack up to
		// Redis' 128.
		n := len(ids[m])
		first, last := rc.ZRangeWithScores(ctx, s.keys[0].pending+":"+m, 0, 0).Val(), rc.ZRangeWithScores(ctx, s.keys[0].pending+":"+m, -1, -1).Val()
		if n > bucketMax+1 && first[0].Score != last[0].Score || (encs[m] == "listpack") != (n <= 128) {
			t.Fatalf("bucket %s: %d entries, a %s", m, n, encs[m])
		}
	}
	// An id of every bucket, first, middle and last, is cancelled, and
	// one of each replaced to due in an hour.
	cancelled, replaced := map[string]bool{}, map[string]bool{}
	for _, m := range members {
		b := ids[m]
		for _, id := range []string{b[0], b[len(b)/2], b[len(b)-1]} {
			if c, err := s.Cancel(ctx, id); err != nil || !c.Existed {
				t.Fatalf("cancel %s: %+v %v", id, c, err)
			}
			cancelled[id] = true
		}
		id := b[len(b)/2+1]
		schedule(t, s, Item{ID: id, DelayMicros: 3600e6, Data: enc("later")})
		replaced[id] = true
	}
	mustBeConsistent(t, s)
	got := claimEvery(t, s, 37)
	inOrder(t, got)
	want := 1000 - len(cancelled) - len(replaced)
	if len(got) != want {
		t.Fatalf("claimed %d, want %d", len(got), want)
	}
	for _, c := range got {
		if cancelled[c.ID] || replaced[c.ID] {
			t.Fatalf("claimed %s, cancelled or replaced", c.ID)
		}
	}
	if c := count(t, s, 0); c.Pending != int64(len(replaced)) || c.Inflight != int64(want) {
		t.Fatalf("counts %+v after the claims", c)
	}
	mustBeConsistent(t, s)
}

// TestBucketLongIDs: ids over 64 bytes make their bucket a skiplist, which
// works the same: schedule, replace, cancel, claim in order.
func TestBucketLongIDs(t *testing.T) {
	t.Parallel()
	s, rc := bucketStore(t)
	ctx := context.Background()
	now := time.Now()
	var items []Item
	for i := range 300 {
		id := strings.Repeat("L", 100) + fmt.Sprintf("%03d", i)
		items = append(items, Item{ID: id, Absolute: true, AtMicros: now.Add(-time.Duration(300-i%150) * time.Millisecond).UnixMicro(),
			Data: enc("x")})
	}
	schedule(t, s, items...)
	members, _, encs := bucketsOf(t, s, rc)
	if len(members) < 2 || encs[members[0]] != "skiplist" {
		t.Fatalf("%d buckets, the first a %s", len(members), encs[members[0]])
	}
	long := items[10].ID
	schedule(t, s, Item{ID: long, DelayMicros: 3600e6, Data: enc("later")})
	if c, err := s.Cancel(ctx, items[11].ID); err != nil || !c.Existed {
		t.Fatalf("cancel: %+v %v", c, err)
	}
	mustBeConsistent(t, s)
	got := claimEvery(t, s, 50)
	inOrder(t, got)
	if len(got) != 298 {
		t.Fatalf("claimed %d of 298", len(got))
	}
	e, err := s.Get(ctx, long)
	if err != nil || e.State != StatePending || e.DueMs < now.Add(59*time.Minute).UnixMilli() {
		t.Fatalf("the replaced long id: %+v %v", e, err)
	}
}

// TestBucketCancelReplaceAfterSplit: an id whose bucket split since it was
// scheduled is found there by cancel and by a replace, which moves it to
// the bucket of its new due time.
func TestBucketCancelReplaceAfterSplit(t *testing.T) {
	t.Parallel()
	s, rc := bucketStore(t)
	ctx := context.Background()
	base := time.Now().Add(time.Hour)
	at := func(i int) int64 { return base.Add(time.Duration(i) * time.Millisecond).UnixMicro() }
	// One bucket first, then it splits again and again.
	schedule(t, s, Item{ID: "a100", Absolute: true, AtMicros: at(100), Data: enc("x")},
		Item{ID: "a400", Absolute: true, AtMicros: at(400), Data: enc("x")})
	for i := range 600 {
		schedule(t, s, Item{ID: fmt.Sprintf("f%03d", i), Absolute: true, AtMicros: at(i), Data: enc("x")})
	}
	members, _, _ := bucketsOf(t, s, rc)
	if len(members) < 5 {
		t.Fatalf("%d buckets", len(members))
	}
	if c, err := s.Cancel(ctx, "a100"); err != nil || !c.Existed {
		t.Fatalf("cancel: %+v %v", c, err)
	}
	// a400 moves from its bucket to the first, which starts there now.
	schedule(t, s, Item{ID: "a400", Absolute: true, AtMicros: at(-5), Data: enc("y")})
	members, ids, _ := bucketsOf(t, s, rc)
	found := 0
	for m, b := range ids {
		for _, id := range b {
			switch id {
			case "a100":
				t.Fatalf("a100 still in bucket %s", m)
			case "a400":
				found++
				if m != members[0] {
					t.Fatalf("a400 in bucket %s, want the first, %s", m, members[0])
				}
			}
		}
	}
	if found != 1 {
		t.Fatalf("a400 in %d buckets", found)
	}
	if e, err := s.Get(ctx, "a400"); err != nil || e.DueMs != ceilMs(at(-5)) {
		t.Fatalf("a400: %+v %v", e, err)
	}
	if c := count(t, s, 0); c.Pending != 601 {
		t.Fatalf("%d pending, want 601", c.Pending)
	}
	mustBeConsistent(t, s)
}

// TestBucketClaimNeverEarly: envelopes due over the next 150 ms, in
// buckets, are claimed as they fall due, in (due, id) order, never early.
func TestBucketClaimNeverEarly(t *testing.T) {
	t.Parallel()
	s, _ := bucketStore(t)
	base := time.Now().Add(-20 * time.Millisecond)
	var items []Item
	for i := range 900 {
		items = append(items, Item{ID: fmt.Sprintf("n%03d", i), Absolute: true,
			AtMicros: base.Add(time.Duration((i*37)%170) * time.Millisecond).UnixMicro(), Data: enc("x")})
	}
	schedule(t, s, items...)
	var got []Claimed
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < len(items) && time.Now().Before(deadline) {
		got = append(got, claimEvery(t, s, 16)...)
		time.Sleep(time.Millisecond)
	}
	inOrder(t, got)
	if len(got) != len(items) {
		t.Fatalf("claimed %d of %d", len(got), len(items))
	}
}

// TestBucketsAfterTheSwitch: what a format-3 daemon put in the due set is
// still claimed after the fleet switched to the buckets, merged with them
// in (due, id) order; the switch waits for every live daemon.
func TestBucketsAfterTheSwitch(t *testing.T) {
	t.Parallel()
	r, _ := newStore(t)
	ctx := context.Background()
	older := New(r.rdb, "m", 1, WithNewestFormat(FormatIntegerLeases))
	newer := New(r.rdb, "m", 1, WithNewestFormat(FormatDueBuckets))
	agree := func(s *Store, id string, want int) {
		t.Helper()
		if got, err := s.AgreeFormats(ctx, id, time.Minute); err != nil || got != want {
			t.Fatalf("%s writes format %d (%v), want %d", id, got, err, want)
		}
	}
	agree(older, "old", FormatIntegerLeases)
	agree(newer, "new", FormatIntegerLeases)
	at := func(i int) int64 { return time.Now().Add(-time.Second).UnixMicro() + int64(i)*1000 }
	var want []string
	for i := range 200 {
		id := fmt.Sprintf("e%03d", i)
		s := older
		if i%2 == 1 {
			s = newer // writes format 3 as well, while older lives
		}
		schedule(t, s, Item{ID: id, Absolute: true, AtMicros: at(i), Data: enc("x")})
		want = append(want, id)
	}
	k := newer.keys[0]
	if n := r.rdb.ZCard(ctx, k.pending).Val(); n != 0 {
		t.Fatalf("%d buckets while a format-3 daemon lives", n)
	}
	if _, err := older.AgreeFormats(ctx, "old", 0); err != nil {
		t.Fatal(err)
	}
	agree(newer, "new", FormatDueBuckets)
	for i := range 200 {
		id := fmt.Sprintf("b%03d", i)
		schedule(t, newer, Item{ID: id, Absolute: true, AtMicros: at(i), Data: enc("x")})
		want = append(want, id)
	}
	// A replace of a format-3 entry moves it to the buckets.
	schedule(t, newer, Item{ID: "e007", Absolute: true, AtMicros: at(7), Data: enc("y")})
	if r.rdb.ZCard(ctx, k.due).Val() != 199 || r.rdb.Get(ctx, k.pending+"#").Val() != "201" {
		t.Fatalf("due %d, buckets %s", r.rdb.ZCard(ctx, k.due).Val(), r.rdb.Get(ctx, k.pending+"#").Val())
	}
	mustBeConsistent(t, newer)
	got := claimEvery(t, newer, 23)
	inOrder(t, got)
	ids := make([]string, len(got))
	for i, c := range got {
		ids[i] = c.ID
	}
	slices.Sort(ids)
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Fatalf("claimed %d, want %d", len(ids), len(want))
	}
	mustBeConsistent(t, newer)
}

// TestBucketsOnTheEmulation: the due buckets work on the Redis emulation
// of --embedded (miniredis runs the same scripts).
func TestBucketsOnTheEmulation(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	s := New(NewClient(Options{Addrs: []string{mr.Addr()}}), "e", 1)
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	s.write.Store(FormatDueBuckets)
	at := time.Now().Add(-time.Second).UnixMicro()
	var items []Item
	for i := range 300 {
		items = append(items, Item{ID: fmt.Sprintf("x%03d", (i*7)%300), Absolute: true, AtMicros: at + int64(i%3)*1000, Data: enc("x")})
	}
	schedule(t, s, items...)
	schedule(t, s, Item{ID: "x005", DelayMicros: 3600e6, Data: enc("y")})
	if c, err := s.Cancel(ctx, "x006"); err != nil || !c.Existed {
		t.Fatal(c, err)
	}
	got := claimEvery(t, s, 50)
	inOrder(t, got)
	if len(got) != 298 {
		t.Fatal(len(got))
	}
	mustBeConsistent(t, s)
}

// TestBucketsUnderClusterAndACL: under Redis Cluster and the ACL of
// docs/security.md, the scripts reach the buckets they name themselves
// (not in KEYS): splits, a bound moved down (RENAME), cancels, claims.
func TestBucketsUnderClusterAndACL(t *testing.T) {
	t.Parallel()
	cl := testutil.StartRedisCluster(t)
	ctx := context.Background()
	for _, n := range cl.Nodes {
		// docs/security.md's line, for namespace "bc", and what a Cluster
		// client needs besides (which that line does not grant).
		if err := n.Client().Do(ctx, "ACL", "SETUSER", "delayd", "on", ">pw", "resetkeys", "~{bc:*", "-@all", "+@read", "+@write",
			"+@scripting", "+@connection", "+time", "-@dangerous", "+info", "+script|load", "+script|exists",
			"+cluster|slots").Err(); err != nil {
			t.Fatal(err)
		}
	}
	s := New(NewClient(Options{Addrs: cl.Addrs(), Username: "delayd", Password: "pw"}), "bc", 6)
	defer s.Close()
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.libraryLoaded(ctx); err != nil || !ok || s.noFunctions.Load() {
		t.Fatalf("the library is not on every master under this ACL: %v %v", ok, err)
	}
	// One master loses its functions: its calls load the library again.
	if err := cl.Nodes[0].Client().FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	s.write.Store(FormatDueBuckets)
	now := time.Now()
	var items []Item
	for i := range 1200 {
		// Due in descending order: every bucket's bound moves down.
		items = append(items, Item{ID: fmt.Sprintf("c%04d", i), Absolute: true, AtMicros: now.Add(-time.Duration(i/3) * time.Millisecond).UnixMicro(),
			Data: enc("x")})
	}
	for i := 0; i < len(items); i += 50 {
		schedule(t, s, items[i:i+50]...)
	}
	for i := 0; i < 1200; i += 7 {
		if c, err := s.Cancel(ctx, items[i].ID); err != nil || !c.Existed {
			t.Fatalf("cancel %s: %+v %v", items[i].ID, c, err)
		}
	}
	mustBeConsistent(t, s)
	got := 0
	for sh := range 6 {
		for {
			res, err := s.Claim(ctx, []int{sh}, ClaimOptions{Batch: 100, Lease: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if len(res[0].Items) == 0 {
				break
			}
			inOrder(t, res[0].Items)
			got += len(res[0].Items)
		}
	}
	if want := 1200 - (1200+6)/7; got != want {
		t.Fatalf("claimed %d, want %d", got, want)
	}
	mustBeConsistent(t, s)
}
