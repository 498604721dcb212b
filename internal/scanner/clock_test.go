package scanner

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// The scanner's estimate of Redis time never runs ahead of Redis, however
// the claim's round trip splits between request and reply and whatever
// the fraction of Redis' millisecond: it is anchored when the reply
// arrived, after Redis read its clock. So a shard planned at Redis time T
// is never claimed before Redis reaches T, and the loop's sleep until T is
// never shorter than Redis' own wait for it.
func TestClockNeverAheadOfRedis(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		there, back time.Duration // the claim's travel to Redis and back
		redisMicros int64         // Redis time when it read its clock
	}{
		{0, 0, 2_000_000_000_000_000},
		{7 * time.Millisecond, 5 * time.Millisecond, 2_000_000_000_000_999},
		{0, 40 * time.Millisecond, 2_000_000_000_000_500},
		{40 * time.Millisecond, 0, 2_000_000_000_000_001},
		{300 * time.Microsecond, 200 * time.Microsecond, 1_000_000_999},
	} {
		t.Run(fmt.Sprintf("%s+%s", tc.there, tc.back), func(t *testing.T) {
			t.Parallel()
			clock := testutil.NewClock()
			var read time.Time // local time when Redis read its clock
			st := newClaimStore(1, func([]int) ([]store.ClaimResult, error) {
				clock.Advance(tc.there)
				read = clock.Now()
				defer clock.Advance(tc.back)
				return []store.ClaimResult{result(0, tc.redisMicros, 0)}, nil
			})
			s := newTestScanner(st, newSwitchPub(), clock, loopOpts)
			if s.clock.nowMs() != 0 || s.clock.until(1) != math.MaxInt64 {
				t.Fatal("a Redis time estimate before any claim")
			}
			s.toPublish = make(chan []claimed, 1)
			if err := s.scan(context.Background(), []int{0}); err != nil {
				t.Fatal(err)
			}
			redisNow := func() int64 { return tc.redisMicros + clock.Now().Sub(read).Microseconds() }
			for _, later := range []time.Duration{0, time.Microsecond, 999 * time.Microsecond, time.Second, time.Hour} {
				clock.Advance(later)
				est, truth := s.clock.nowMs(), redisNow()/1000
				if est > truth {
					t.Errorf("%s after the claim the estimate %d ms is ahead of Redis' %d ms", later, est, truth)
				}
				if lag := truth - est; time.Duration(lag)*time.Millisecond > tc.back+time.Millisecond {
					t.Errorf("%s after the claim the estimate lags %d ms, more than the reply's %s", later, lag, tc.back)
				}
				at := truth + 100 // a plan 100 ms ahead by Redis
				if wait, redisWait := s.clock.until(at), time.Duration(at*1000-redisNow())*time.Microsecond; wait < redisWait {
					t.Errorf("sleeps %s for a plan Redis reaches in %s", wait, redisWait)
				}
			}
		})
	}
}
