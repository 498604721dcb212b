package scanner

import (
	"context"
	"errors"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

var loopOpts = Options{ClaimBatch: 10, Lease: 10 * time.Second, IdleInterval: time.Second,
	RetryBackoff: time.Second, RetryBackoffMax: time.Minute, MaxAttempts: 3}

// A shard is claimed again at the earliest of its next due time, its next
// lease expiry and an idle interval from now; at once after a full claim,
// since more may be due right now.
func TestPlan(t *testing.T) {
	t.Parallel()
	const now = int64(5_000_000) // ms
	s := newTestScanner(&claimStore{shards: 1}, newSwitchPub(), testutil.NewClock(), loopOpts)
	for _, tc := range []struct {
		name               string
		nextDue, nextLease int64
		items, missing     int
		want               int64
	}{
		{"nothing pending: the idle interval", -1, -1, 0, 0, now + 1000},
		{"next due", now + 300, -1, 0, 0, now + 300},
		{"next lease expiry", -1, now + 200, 0, 0, now + 200},
		{"lease before due", now + 300, now + 200, 0, 0, now + 200},
		{"due before lease", now + 100, now + 200, 3, 0, now + 100},
		{"both beyond the idle interval", now + 5000, now + 7000, 0, 0, now + 1000},
		{"due already (the claim was partial)", now - 20, -1, 9, 0, now - 20},
		{"full claim", now + 300, now + 200, 10, 0, 0},
		{"full with missing ids", now + 300, -1, 7, 3, 0},
	} {
		r := result(0, now*1000+999, tc.items)
		r.NextDueMs, r.NextLeaseMs, r.Missing = tc.nextDue, tc.nextLease, tc.missing
		if got := s.plan(r); got != tc.want {
			t.Errorf("%s: planned at %d, want %d", tc.name, got, tc.want)
		}
	}
}

// After a claim, each shard's plan is what its claim returned, the loop
// finds due only the shard whose plan has come, and it sleeps, in local
// time, exactly until the earliest other plan: Redis time is years away
// from the local clock here, so mixing the two would show.
func TestSleepPlanning(t *testing.T) {
	t.Parallel()
	clock := testutil.NewClock()
	const redisMs = int64(2_000_000_000_000)
	st := newClaimStore(3, func(shards []int) ([]store.ClaimResult, error) {
		r0 := result(0, redisMs*1000, 1)
		r0.NextDueMs, r0.NextLeaseMs = redisMs+300, redisMs+100
		return []store.ClaimResult{r0, result(1, redisMs*1000, 0), result(2, redisMs*1000, loopOpts.ClaimBatch)}, nil
	})
	s := newTestScanner(st, newSwitchPub(), clock, loopOpts)
	toPublish := make(chan []claimed, 1)
	s.toPublish = toPublish
	if due, _ := s.dueShards(s.clock.nowMs(), nil); !reflect.DeepEqual(due, []int{0, 1, 2}) {
		t.Fatalf("before any claim due %v, want every shard", due)
	}
	if err := s.scan(context.Background(), []int{0, 1, 2}); err != nil {
		t.Fatal(err)
	}
	if n := len(<-toPublish); n != 1+loopOpts.ClaimBatch {
		t.Errorf("%d envelopes handed to the publish stage, want %d", n, 1+loopOpts.ClaimBatch)
	}
	for sh, want := range []int64{redisMs + 100, redisMs + 1000, 0} {
		if got := s.next[sh].Load(); got != want {
			t.Errorf("shard %d planned at %d, want %d", sh, got, want)
		}
	}
	due, earliest := s.dueShards(s.clock.nowMs(), nil)
	if !reflect.DeepEqual(due, []int{2}) || earliest != redisMs+100 {
		t.Fatalf("due %v, earliest other plan %d; want [2] and %d", due, earliest, redisMs+100)
	}
	if d := s.clock.until(earliest); d != 100*time.Millisecond {
		t.Errorf("sleeps %s until the lease expiry, want 100ms", d)
	}
	clock.Advance(100 * time.Millisecond)
	if due, _ := s.dueShards(s.clock.nowMs(), nil); !reflect.DeepEqual(due, []int{0, 2}) {
		t.Errorf("100ms later due %v, want [0 2]", due)
	}
	// Unowned shards are neither due nor planned for.
	s.owned[0].Store(false)
	s.owned[2].Store(false)
	if due, earliest := s.dueShards(s.clock.nowMs(), nil); len(due) != 0 || earliest != redisMs+1000 {
		t.Errorf("with only shard 1 owned: due %v, earliest %d", due, earliest)
	}
}

// The loop sleeps at most an idle interval, however far its plan is.
func TestSleepCappedByIdleInterval(t *testing.T) {
	t.Parallel()
	opt := loopOpts
	opt.IdleInterval = 20 * time.Millisecond
	s := New(&claimStore{shards: 1}, newSwitchPub(), nil, opt, hclog.NewNullLogger())
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	done := make(chan bool, 1)
	go func() { done <- s.sleep(context.Background(), timer, time.Duration(math.MaxInt64)) }()
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("sleep reported a cancelled context")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("asked to sleep for ever, slept past 10s with an idle interval of 20ms")
	}
}

// A full claim means more may be due: the loop claims again at once, with
// the clock standing still, not after the idle interval (an hour here).
func TestFullBatchClaimsAgainAtOnce(t *testing.T) {
	t.Parallel()
	clock := testutil.NewClock()
	opt := loopOpts
	opt.IdleInterval = time.Hour
	n := 0
	st := newClaimStore(1, func([]int) ([]store.ClaimResult, error) {
		n++
		items := 0
		if n <= 2 {
			items = opt.ClaimBatch // two full claims, then a partial one
		}
		r := result(0, 3_000_000_000, items)
		r.NextDueMs = 3_000_000 + 60_000
		return []store.ClaimResult{r}, nil
	})
	pub := newSwitchPub()
	s := newTestScanner(st, pub, clock, opt)
	run(t, s)
	for range 3 {
		st.nextClaim(t)
	}
	eventually(t, "the partial claim plans the next due time", func() bool { return s.next[0].Load() == 3_000_000+60_000 })
}

// Only the shards whose claims fail wait out a backoff, each its own,
// doubling to a second; the others are planned from their results as
// usual, and the loop sleeps no global backoff. Success clears a shard's
// backoff.
func TestClaimBackoffPerShard(t *testing.T) {
	t.Parallel()
	clock := testutil.NewClock()
	const redisMs = int64(2_000_000_000_000)
	failing := map[int]bool{}
	down := errors.New("store: claim: connection refused")
	st := newClaimStore(3, func(shards []int) ([]store.ClaimResult, error) {
		var res []store.ClaimResult
		var err error
		for _, sh := range shards {
			if failing[sh] {
				err = down
				continue
			}
			res = append(res, result(sh, redisMs*1000, 0))
		}
		return res, err
	})
	s := newTestScanner(st, newSwitchPub(), clock, loopOpts)
	all := []int{0, 1, 2}
	if err := s.scan(context.Background(), all); err != nil { // sets the Redis clock
		t.Fatal(err)
	}
	failing[1] = true
	for _, want := range []time.Duration{50, 100, 200, 400, 800, 1000, 1000} {
		if err := s.scan(context.Background(), all); err != nil {
			t.Fatalf("a partial failure returned %v: the loop would sleep a global backoff", err)
		}
		if got := s.next[1].Load(); got != redisMs+(want*time.Millisecond).Milliseconds() {
			t.Errorf("failing shard planned at +%dms, want +%dms", got-redisMs, want)
		}
		for _, sh := range []int{0, 2} {
			if got := s.next[sh].Load(); got != redisMs+1000 {
				t.Errorf("healthy shard %d planned at +%dms, want the idle interval", sh, got-redisMs)
			}
		}
		if s.backoff != 0 {
			t.Errorf("global backoff %s after a partial failure", s.backoff)
		}
	}
	failing[1] = false
	if err := s.scan(context.Background(), all); err != nil || len(s.failing) != 0 {
		t.Fatalf("after the shard recovered: %v, still backing off %v", err, s.failing)
	}
	failing[1] = true
	_ = s.scan(context.Background(), all)
	if s.next[1].Load() != redisMs+50 {
		t.Errorf("a new failure after recovery planned at +%dms, want +50ms", s.next[1].Load()-redisMs)
	}
}

// Before any claim succeeded there is no Redis time to plan a shard's
// retry with: every shard stays due and the loop sleeps a global backoff.
func TestClaimBackoffBeforeAnyClaim(t *testing.T) {
	t.Parallel()
	st := newClaimStore(2, func([]int) ([]store.ClaimResult, error) { return nil, errors.New("refused") })
	s := newTestScanner(st, newSwitchPub(), testutil.NewClock(), loopOpts)
	for _, want := range []time.Duration{50, 100, 200} {
		if err := s.scan(context.Background(), []int{0, 1}); err == nil {
			t.Fatal("a failed first claim returned no error")
		}
		if s.backoff != want*time.Millisecond || s.next[0].Load() != 0 || s.next[1].Load() != 0 {
			t.Errorf("backoff %s, plans %d %d; want %dms and both due", s.backoff, s.next[0].Load(), s.next[1].Load(), want)
		}
	}
}

// In the running loop, a shard whose claims fail does not hold the others
// back: with the clock standing still, a shard with work is claimed again
// and again while the failing one waits for its backoff, and the failing
// one is claimed again once the clock passes it.
func TestFailingShardDoesNotHoldOthersBack(t *testing.T) {
	t.Parallel()
	clock := testutil.NewClock()
	const redisMs = int64(2_000_000_000_000)
	start := clock.Now()
	st := newClaimStore(2, func(shards []int) ([]store.ClaimResult, error) {
		// Redis time moves with the local clock.
		r := result(0, redisMs*1000+clock.Now().Sub(start).Microseconds(), loopOpts.ClaimBatch)
		if slices.Contains(shards, 1) {
			return []store.ClaimResult{r}, errors.New("shard 1's node is down")
		}
		return []store.ClaimResult{r}, nil
	})
	s := newTestScanner(st, newSwitchPub(), clock, loopOpts)
	s.clock.set(redisMs*1000, start) // as after an earlier claim
	run(t, s)
	if got := st.nextClaim(t); !reflect.DeepEqual(got, []int{0, 1}) {
		t.Fatalf("first claim of %v, want both shards", got)
	}
	for i := range 20 {
		if got := st.nextClaim(t); !reflect.DeepEqual(got, []int{0}) {
			t.Fatalf("claim %d after the failure: %v, want only the healthy shard", i, got)
		}
	}
	clock.Advance(50 * time.Millisecond)
	for i := 0; !slices.Contains(st.nextClaim(t), 1); i++ {
		if i == 100 {
			t.Fatal("the failing shard was not claimed again after its backoff")
		}
	}
}

// While the publisher cannot publish, nothing is claimed (no envelope
// would wait under a lease or spend its attempts); claims resume once it
// is connected.
func TestNoClaimWhileDisconnected(t *testing.T) {
	t.Parallel()
	st := newClaimStore(2, func(shards []int) ([]store.ClaimResult, error) {
		return []store.ClaimResult{result(0, 1_000_000, 0), result(1, 1_000_000, 0)}, nil
	})
	pub := newSwitchPub()
	pub.down.Store(true)
	s := newTestScanner(st, pub, testutil.NewClock(), loopOpts)
	run(t, s)
	// Three rounds of the paused loop, each asking whether NATS is back.
	for range 3 {
		select {
		case up := <-pub.asked:
			if up {
				t.Fatal("connected too early")
			}
		case sh := <-st.claims:
			t.Fatalf("claimed %v while disconnected", sh)
		case <-time.After(10 * time.Second):
			t.Fatal("the loop stopped asking whether NATS is back")
		}
	}
	select {
	case sh := <-st.claims:
		t.Fatalf("claimed %v while disconnected", sh)
	default:
	}
	pub.down.Store(false)
	if got := st.nextClaim(t); !reflect.DeepEqual(got, []int{0, 1}) {
		t.Errorf("once connected, claimed %v, want both shards", got)
	}
}
