package store

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Outcome is what becomes of a claimed envelope.
type Outcome byte

// The outcomes of a delivery.
const (
	Delivered Outcome = 'a' // published: delete it
	Retry     Outcome = 'r' // failed: due again after the retry delay
	Postpone  Outcome = 'u' // never sent: like Retry, the attempt given back
	Bury      Outcome = 'd' // failed for the last time: to the dead set
	// Next: an occurrence of a series was published; the next one is due
	// at NextDueMs, with fresh attempts.
	Next Outcome = 'n'
	// Hold: held by flow control, never sent: due again at HoldUntilMs
	// (a rate limit's slot, or a paused target's parking place, flow.go),
	// the attempt not counted.
	Hold Outcome = 'h'
)

// Settle is the outcome of one delivery.
type Settle struct {
	ID      string
	Token   string // of the claim being settled
	Outcome Outcome
	Error   string // why it failed, kept for inspection (Retry, Bury)
	// NextDueMs is when the next occurrence is due (Next).
	NextDueMs int64
	// HoldUntilMs is when a held envelope is due again (Hold), Redis ms.
	HoldUntilMs int64
	// RetryDelay, if > 0, replaces Ack's retry delay for this one (Retry,
	// Postpone).
	RetryDelay time.Duration
	// Request is the delivered one-shot's request fingerprint
	// (envelope.Envelope.Request), kept as its tombstone from SinceMs
	// while resends are remembered (WithResendMemory): its due time, or
	// when it was accepted if that is later (a Delayd-At in the past), so
	// the window never starts before the request was made.
	Request string
	SinceMs int64
}

// Acked is what an Ack did.
type Acked struct {
	// Settled counts the settles whose token was still the claim; Buried
	// those of them that moved an envelope to the dead set.
	Settled, Buried int
	NowMs           int64 // Redis time
	// Unsettled holds, by shard, the settles of the script calls that
	// failed (nil when none did): a retry sends just these. A call that
	// failed with its outcome unknown may have run; sent again, its
	// settles change nothing, as each one ended its claim.
	Unsettled map[int][]Settle
}

// Ack settles deliveries, one script call per Redis node (of at most
// ackChunk settles), all in one pipeline.
// On error, the result counts those that were settled, and holds in
// Unsettled those of the calls that failed; byShard is left as it is.
// Released envelopes are due again after retry. A settle whose token is no
// longer the envelope's claim (replaced, cancelled or re-claimed meanwhile)
// is ignored.
func (s *Store) Ack(ctx context.Context, byShard map[int][]Settle, retry time.Duration) (Acked, error) {
	shards := slices.Sorted(maps.Keys(byShard))
	calls, res, err := execByNode(ctx, s, OpAck, ackCalls(byShard, shards, s.byNode(ctx, shards)),
		func(parts []ackPart) ackArgs { return s.ackArgs(parts, retry) })
	var a Acked
	for _, r := range res {
		if r.ran {
			a.NowMs = max(a.NowMs, r.reply.nowMs)
			a.Settled += r.reply.settled
			a.Buried += r.reply.buried
		}
	}
	if err != nil {
		a.Unsettled = map[int][]Settle{}
		for i, r := range res {
			if !r.ran {
				for _, p := range calls[i] {
					a.Unsettled[p.shard] = append(a.Unsettled[p.shard], p.items...)
				}
			}
		}
		return a, fmt.Errorf("store: ack: %w", err)
	}
	return a, nil
}

// ackPart is one shard's settles in an ack call.
type ackPart struct {
	shard int
	items []Settle
}

// ackCalls packs the settles of shards (grouped by node, by their index
// in shards) into calls of at most ackChunk settles, each of one node's
// shards.
func ackCalls(byShard map[int][]Settle, shards []int, groups [][]int) [][]ackPart {
	var calls [][]ackPart
	for _, g := range groups {
		var cur []ackPart
		n := 0
		for _, i := range g {
			items := byShard[shards[i]]
			for first := true; first || len(items) > 0; first = false {
				take := min(len(items), ackChunk-n)
				cur = append(cur, ackPart{shards[i], items[:take]})
				n, items = n+take, items[take:]
				if n == ackChunk {
					calls, cur, n = append(calls, cur), nil, 0
				}
			}
		}
		if len(cur) > 0 {
			calls = append(calls, cur)
		}
	}
	return calls
}

// ackArgs encodes one call of parts.
func (s *Store) ackArgs(parts []ackPart, retry time.Duration) ackArgs {
	a := ackArgs{retryMs: retry.Milliseconds(), resendsMs: s.resends.Milliseconds(), shards: make([]ackShard, len(parts))}
	for j, p := range parts {
		sh := ackShard{keys: &s.keys[p.shard], settles: make([]ackSettle, len(p.items))}
		for k, st := range p.items {
			sh.settles[k] = ackOp(st, s.resends > 0)
		}
		a.shards[j] = sh
	}
	return a
}

// ackChunk bounds the envelopes of one ack script call.
const ackChunk = 1000
