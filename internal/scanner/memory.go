package scanner

import (
	"math"
	"runtime/debug"
	"sync/atomic"
)

// Memory: the bytes of claimed envelopes are bounded from the claim to the
// end of their publish, so large payloads cannot pull more into a sidecar
// than its memory limit holds. A claim takes at most Options.ClaimBytes,
// and no claim starts while inflightFactor claims' worth is held. Each
// envelope's overhead stays held until its settle is written, so a slow
// ack stage holds the clock back instead of queueing settles without
// bound.

// DefaultClaimBytes is the claim budget without a Go memory limit: a
// sixteenth of 64 MiB, the footprint delayd aims at beside a pod. Four
// claims held (a quarter of it) double at most under the GC's default
// headroom; four claims of 8 MiB took the peak RSS to 66-79 MiB behind a
// backlog at 100k due/s, four of 4 MiB to 61 MiB.
const DefaultClaimBytes = 4 << 20

// maxClaimBytes caps the budget derived from a memory limit: larger claims
// buy no speed.
const maxClaimBytes = 8 << 20

// inflightFactor is how many claims' bytes may be held at once: one
// claiming, the rest queued or publishing.
const inflightFactor = 4

// AutoClaimBytes is the default claim budget: a sixteenth of the Go memory
// limit when one is set, at most maxClaimBytes (5.4 MiB under the chart's
// 96 Mi, whose GOMEMLIMIT is 90% of it), so the bytes held, four claims'
// worth, take a quarter of the limit; DefaultClaimBytes without one.
func AutoClaimBytes() int64 {
	limit := debug.SetMemoryLimit(-1)
	if limit <= 0 || limit == math.MaxInt64 {
		return DefaultClaimBytes
	}
	return max(min(maxClaimBytes, limit/16), 64<<10)
}

// byteBudget counts the bytes held between claim and publish (claims), and
// the overhead of envelopes published and not yet acked (settles). Both
// return to zero once the work is done: bytes never given back shrink the
// room to claim until the clock stops for good, so they are gauges
// (delayd_claims_held_bytes, delayd_settles_held_bytes), and a pause is
// logged (loop.go).
type byteBudget struct {
	limit   int64 // per claim; 0: no bound
	claims  atomic.Int64
	settles atomic.Int64
	freed   chan struct{} // a release happened
}

func newByteBudget(claimBytes int64) *byteBudget {
	return &byteBudget{limit: claimBytes, freed: make(chan struct{}, 1)}
}

// next is the byte budget of the next claim, and false while too much is
// held to claim at all.
func (b *byteBudget) next() (int64, bool) {
	if b.limit <= 0 {
		return 0, true
	}
	room := inflightFactor*b.limit - b.claims.Load() - b.settles.Load()
	if room <= 0 {
		return 0, false
	}
	return min(b.limit, room), true
}

// take counts n bytes claimed.
func (b *byteBudget) take(n int64) { b.claims.Add(n) }

// published frees the n bytes of a published (or given back) batch but
// kept, which its settles hold until acked.
func (b *byteBudget) published(n, kept int64) {
	b.settles.Add(kept)
	b.claims.Add(-n)
	b.signal()
}

// acked frees what written settles held.
func (b *byteBudget) acked(n int64) {
	if n == 0 {
		return
	}
	b.settles.Add(-n)
	b.signal()
}

func (b *byteBudget) signal() {
	select {
	case b.freed <- struct{}{}:
	default:
	}
}

// envelopeOverhead is what an envelope costs the daemon beyond its stored
// bytes while it is delivered: its decoded headers, its NATS message, its
// reply subject and its settle, about 1 KiB (the heap profile's allocation
// sites at 100k due/s). Counted with the bytes, it bounds small envelopes
// too: four claims of 8 MiB held 200,000 envelopes of 160 bytes, whose
// Go objects, not payloads, took the heap (RSS 135-146 MiB behind a
// backlog); now they hold about 28,000. Held until the ack: behind a slow
// ack (resend tombstones) 60,000 settles queued for it besides those.
const envelopeOverhead = 1 << 10

// bytesOf is what claimed envelopes hold: their stored bytes and each
// one's overhead.
func bytesOf(items []claimed) int64 {
	var n int64
	for _, c := range items {
		n += int64(len(c.Data)) + envelopeOverhead
	}
	return n
}
