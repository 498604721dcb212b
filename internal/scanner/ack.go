package scanner

// The ack stage: settles of published batches are written in one pipeline,
// and shards with envelopes pending again (retry, postpone, next) are
// planned for them.

import (
	"context"
	"time"

	"github.com/delayd/delayd/internal/store"
)

// settled is a published batch's settles, and the budget its envelopes
// still hold until the settles are written (memory.go).
type settled struct {
	byShard map[int][]store.Settle
	held    int64
}

// ackStage settles published batches, merging those that queued up into one
// pipeline, and only then frees what their envelopes held of the budget.
func (s *Scanner) ackStage(ctx context.Context, in <-chan settled) {
	for b := range in {
		b = drain(b, in, func(a, b settled) settled {
			for sh, v := range b.byShard {
				a.byShard[sh] = append(a.byShard[sh], v...)
			}
			a.held += b.held
			return a
		})
		s.ack(ctx, b.byShard)
		s.budget.acked(b.held)
	}
}

// drain merges into first every batch already waiting in in, without
// blocking, so a stage that fell behind catches up in one round trip.
func drain[T any](first T, in <-chan T, merge func(T, T) T) T {
	for {
		select {
		case more, ok := <-in:
			if !ok {
				return first
			}
			first = merge(first, more)
		default:
			return first
		}
	}
}

// ack writes one merged batch of settles, trying twice; then it plans the
// shards of retried and postponed envelopes, of next occurrences and of
// envelopes held for a rate limit's slot for when they are due (the
// claim that handed them out planned without them: a held envelope would
// otherwise wait for the idle interval, and a limit's slots go out in
// bursts of it).
func (s *Scanner) ack(ctx context.Context, settles map[int][]store.Settle) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opt.Lease)
	defer cancel()
	// Retried and postponed envelopes are pending again after their retry
	// delay: plan their shards' next claim for the earliest, as for a new
	// envelope.
	again := map[int]time.Duration{} // shard → earliest retry delay
	nexts := map[int]int64{}         // shard → earliest next occurrence or slot
	for sh, v := range settles {
		for _, st := range v {
			if st.Outcome == store.Retry || st.Outcome == store.Postpone {
				d := st.RetryDelay
				if d <= 0 {
					d = s.opt.RetryBackoff // the store's default for the call
				}
				if cur, ok := again[sh]; !ok || d < cur {
					again[sh] = d
				}
			}
			if st.Outcome == store.Next && (nexts[sh] == 0 || st.NextDueMs < nexts[sh]) {
				nexts[sh] = st.NextDueMs
			}
			// A paused one waits for its resume, which wakes every shard.
			if st.Outcome == store.Hold && st.HoldUntilMs < store.ParkedBase && (nexts[sh] == 0 || st.HoldUntilMs < nexts[sh]) {
				nexts[sh] = st.HoldUntilMs
			}
		}
	}
	all := settles
	for try := 0; ; try++ {
		a, err := s.store.Ack(actx, settles, s.opt.RetryBackoff)
		// Counted as the store confirms: a stale settle (replaced,
		// cancelled or re-claimed meanwhile) buries nothing.
		if a.Buried > 0 {
			s.obs.Dead(a.Buried)
		}
		nowMs := a.NowMs
		if err == nil {
			for sh, d := range again {
				s.WakeLocal(sh, nowMs+d.Milliseconds())
			}
			for sh, due := range nexts {
				s.WakeLocal(sh, due)
			}
			s.signalAcked(all)
			return
		}
		s.obs.RedisError(store.OpAck)
		// The next try sends only what the store did not settle.
		settles = a.Unsettled
		if try == 1 || actx.Err() != nil {
			// The leases expire and the envelopes are delivered again:
			// a duplicate, never a loss.
			n := 0
			for _, v := range settles {
				n += len(v)
			}
			s.log.Error("ack failed, envelopes will be redelivered after their lease", "count", n, "error", err)
			return
		}
		sleepCtx(actx, time.Duration(try+1)*50*time.Millisecond)
	}
}

// signalAcked tells Options.Acked of the ids of settles written.
func (s *Scanner) signalAcked(settles map[int][]store.Settle) {
	if s.opt.Acked == nil {
		return
	}
	var ids []string
	for _, v := range settles {
		for _, st := range v {
			ids = append(ids, st.ID)
		}
	}
	s.opt.Acked(ids)
}

// sleepCtx sleeps for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
