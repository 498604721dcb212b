package store

import (
	"context"
	"fmt"
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
)

// Settle is the outcome of one delivery.
type Settle struct {
	ID      string
	Token   string // of the claim being settled
	Outcome Outcome
	Error   string // why it failed, kept for inspection (Retry, Bury)
	// NextDueMs is when the next occurrence is due (Next).
	NextDueMs int64
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

// Ack settles deliveries, one script call per shard, all in one pipeline.
// On error, the result counts those that were settled, and holds in
// Unsettled those of the calls that failed; byShard is left as it is.
// Released envelopes are due again after retry. A settle whose token is no
// longer the envelope's claim (replaced, cancelled or re-claimed meanwhile)
// is ignored.
func (s *Store) Ack(ctx context.Context, byShard map[int][]Settle, retry time.Duration) (Acked, error) {
	// Calls of at most ackChunk envelopes keep one script call short.
	type chunk struct {
		shard int
		items []Settle
	}
	var calls []chunk
	for sh, items := range byShard {
		for len(items) > ackChunk {
			calls = append(calls, chunk{sh, items[:ackChunk]})
			items = items[ackChunk:]
		}
		calls = append(calls, chunk{sh, items})
	}
	args := make([]ackArgs, len(calls))
	for i, c := range calls {
		args[i] = ackArgs{shard: &s.keys[c.shard], retryMs: retry.Milliseconds(), resendsMs: s.resends.Milliseconds(),
			settles: make([]ackSettle, len(c.items))}
		for j, st := range c.items {
			args[i].settles[j] = ackOp(st, s.resends > 0)
		}
	}
	res, err := exec(ctx, s, OpAck, args)
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
				a.Unsettled[calls[i].shard] = append(a.Unsettled[calls[i].shard], calls[i].items...)
			}
		}
		return a, fmt.Errorf("store: ack: %w", err)
	}
	return a, nil
}

// ackChunk bounds the envelopes of one ack script call.
const ackChunk = 1000
