package scanner

// Time as the scanner knows it: Redis time estimated from the last claim,
// and the backoff of shards whose claims fail.

import (
	"math"
	"sync/atomic"
	"time"
)

// redisClock estimates Redis time from the local monotonic clock. It is
// anchored at the moment a claim reply arrived, which is after Redis read
// its clock, so the estimate runs slightly behind Redis: wake-ups are a
// little late, never early. The loop sets it; intake goroutines read it.
type redisClock struct {
	now         func() time.Time // the local clock (Options.Now)
	base        time.Time        // local monotonic origin
	redisMicros atomic.Int64     // Redis time at the anchor
	localNanos  atomic.Int64     // the anchor, as time since base
}

func newRedisClock(now func() time.Time) *redisClock {
	return &redisClock{now: now, base: now()}
}

// set anchors the estimate: Redis time was redisMicros at local time
// local, or earlier.
func (c *redisClock) set(redisMicros int64, local time.Time) {
	c.localNanos.Store(int64(local.Sub(c.base)))
	c.redisMicros.Store(redisMicros)
}

// elapsed is the local time since the anchor.
func (c *redisClock) elapsed() time.Duration {
	return c.now().Sub(c.base) - time.Duration(c.localNanos.Load())
}

// nowMs is the estimated Redis time in ms, 0 before the first claim.
func (c *redisClock) nowMs() int64 {
	r := c.redisMicros.Load()
	if r == 0 {
		return 0 // before the first claim every plan of 0 is due
	}
	return (r + c.elapsed().Nanoseconds()/1000) / 1000
}

// until returns the local duration until Redis time atMs.
func (c *redisClock) until(atMs int64) time.Duration {
	r := c.redisMicros.Load()
	if atMs == math.MaxInt64 || r == 0 {
		return math.MaxInt64
	}
	return time.Duration(atMs*1000-r)*time.Microsecond - c.elapsed()
}

const (
	minBackoff = 50 * time.Millisecond
	// maxBackoff caps retries of failing shards: a recovered Redis is
	// claimed from within a second, and an outage costs a pipeline a second.
	maxBackoff = time.Second
)

// nextBackoff is the backoff of a failing shard (or, before any claim
// succeeded, of all) after one more failure: doubling from minBackoff up
// to maxBackoff.
func nextBackoff(b time.Duration) time.Duration {
	if b == 0 {
		return minBackoff
	}
	return min(2*b, maxBackoff)
}
