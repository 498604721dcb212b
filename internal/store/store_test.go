package store

import (
	"context"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/testutil"
)

func newStore(t *testing.T) (*Store, *testutil.Redis) {
	t.Helper()
	r := testutil.StartRedis(t)
	s := New(NewClient(Options{Addrs: []string{r.Addr}}), "t", 4)
	t.Cleanup(func() { s.Close() })
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s, r
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
	s, _ := newStore(t)
	ctx := context.Background()
	due, err := s.Schedule(ctx, []Item{
		{ID: "now", Data: enc("a")},
		{ID: "later", DelayMicros: int64(time.Hour / time.Microsecond), Data: enc("b")},
		{ID: "past", Absolute: true, AtMicros: time.Now().Add(-time.Minute).UnixMicro(), Data: enc("c")},
	})
	if err != nil {
		t.Fatal(err)
	}
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
	c := got["now"]
	n, err := s.Ack(ctx, map[int][]Settle{s.Shard("now"): {{ID: "now", Version: envelope.Version(c.Data)}}}, 0)
	if err != nil || n != 1 {
		t.Fatalf("ack: %d %v", n, err)
	}
	counts := count(t, s, s.Shard("later"))
	if counts.Pending != 1 {
		t.Fatalf("pending %+v", counts)
	}
}

func TestAckNeverDeletesNewerVersion(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	if _, err := s.Schedule(ctx, []Item{{ID: "o1", Data: enc("v1")}}); err != nil {
		t.Fatal(err)
	}
	old := claimAll(t, s, time.Minute)["o1"]
	// Replaced while the old version is in flight.
	if _, err := s.Schedule(ctx, []Item{{ID: "o1", DelayMicros: 3600e6, Data: enc("v2")}}); err != nil {
		t.Fatal(err)
	}
	n, err := s.Ack(ctx, map[int][]Settle{s.Shard("o1"): {{ID: "o1", Version: envelope.Version(old.Data)}}}, 0)
	if err != nil || n != 0 {
		t.Fatalf("stale ack settled %d (%v)", n, err)
	}
	counts := count(t, s, s.Shard("o1"))
	if counts.Pending != 1 || counts.Inflight != 0 {
		t.Fatalf("newer envelope lost: %+v", counts)
	}
}

func TestCancel(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	_, _ = s.Schedule(ctx, []Item{{ID: "c", DelayMicros: 3600e6, Data: enc("x")}})
	if ok, err := s.Cancel(ctx, "c"); !ok || err != nil {
		t.Fatalf("cancel: %v %v", ok, err)
	}
	if ok, _ := s.Cancel(ctx, "c"); ok {
		t.Fatal("second cancel reported true")
	}
}

func TestReapKeepsAttemptsAndDue(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	_, _ = s.Schedule(ctx, []Item{{ID: "r", Data: enc("x")}})
	sh := s.Shard("r")
	first := claimAll(t, s, time.Millisecond)["r"]
	for attempt := 2; attempt <= 4; attempt++ {
		time.Sleep(5 * time.Millisecond) // let the 1 ms lease expire in Redis time
		if n, err := s.Reap(ctx, []int{sh}, 10); err != nil || n != 1 {
			t.Fatalf("reap: %d %v", n, err)
		}
		rs, err := s.Claim(ctx, []int{sh}, ClaimOptions{Batch: 10, Lease: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if res := rs[0]; len(res.Items) != 1 || res.Items[0].Attempt != attempt || res.Items[0].DueMs != first.DueMs {
			t.Fatalf("attempt %d: %+v", attempt, res)
		}
	}
}

func TestBuryReplayPurge(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	_, _ = s.Schedule(ctx, []Item{{ID: "d1", Data: enc("x")}, {ID: "d2", Data: enc("y")}})
	got := claimAll(t, s, time.Minute)
	bury := map[int][]Settle{}
	for _, id := range []string{"d1", "d2"} {
		bury[s.Shard(id)] = append(bury[s.Shard(id)], Settle{ID: id, Version: envelope.Version(got[id].Data), Outcome: Bury, Error: "no stream"})
	}
	if n, err := s.Ack(ctx, bury, time.Second); err != nil || n != 2 {
		t.Fatalf("bury: %d %v", n, err)
	}
	e, err := s.Get(ctx, "d1")
	if err != nil || e.State != StateDead || e.Error != "no stream" || e.Attempts != 1 {
		t.Fatalf("dead entry: %+v %v", e, err)
	}
	if n, err := s.Replay(ctx, []string{"d1", "nope"}); err != nil || n != 1 {
		t.Fatalf("replay: %d %v", n, err)
	}
	again := claimAll(t, s, time.Minute)
	if c, ok := again["d1"]; !ok || c.Attempt != 1 {
		t.Fatalf("replayed envelope must be due with a fresh attempt count: %+v", again)
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
}

func TestRelease(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	_, _ = s.Schedule(ctx, []Item{{ID: "rel", Data: enc("x")}})
	c := claimAll(t, s, time.Minute)["rel"]
	n, err := s.Ack(ctx, map[int][]Settle{s.Shard("rel"): {{ID: "rel", Version: envelope.Version(c.Data), Outcome: Retry, Error: "boom"}}}, time.Hour)
	if err != nil || n != 1 {
		t.Fatalf("release: %d %v", n, err)
	}
	rs, _ := s.Claim(ctx, []int{s.Shard("rel")}, ClaimOptions{Batch: 10, Lease: time.Minute})
	if res := rs[0]; len(res.Items) != 0 || res.NextDueMs < res.NowMs()+3000_000 {
		t.Fatalf("released envelope must wait for the retry delay: %+v", rs[0])
	}
}

func TestNoScriptReload(t *testing.T) {
	s, r := newStore(t)
	ctx := context.Background()
	if err := r.Client().ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Schedule(ctx, []Item{{ID: "a", Data: enc("x")}, {ID: "b", Data: enc("y")}}); err != nil {
		t.Fatalf("schedule after SCRIPT FLUSH: %v", err)
	}
	_ = r.Client().ScriptFlush(ctx).Err()
	if got := claimAll(t, s, time.Minute); len(got) != 2 {
		t.Fatalf("claim after SCRIPT FLUSH: %+v", got)
	}
}
