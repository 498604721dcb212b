package scanner

// The publish stage: claimed envelopes go out, and each publish result
// becomes the settle the ack stage writes (outcome).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
)

// stageDepth is how many batches may wait between stages. Claimed
// envelopes wait there under their lease, so it stays small.
const stageDepth = 4

// publishWorkers is how many batches may be publishing at once. Each
// waits a round trip for its confirmation (a flush, PubAcks, a stream's
// answer) while the batches behind it are written: on a slow path (200 ms
// RTT) a batch that finds every worker busy waits up to one more round
// trip, and with 4 workers deliveries were 0.4 s late there. A waiting
// worker is a goroutine; what the batches hold is bounded by the claim
// budget, not by this.
const publishWorkers = 16

// largeEnvelope is the stored size from which an envelope goes out after
// the small ones of its batch (publish).
const largeEnvelope = 64 << 10

// maxOccurrence is the largest occurrence number the store keeps.
const maxOccurrence = 1<<32 - 1

// errStale: a batch waited so long for the publish stage that too little of
// its lease was left to publish safely. Nothing was sent.
var errStale = fmt.Errorf("claimed too long ago to publish within its lease: %w", ErrUnreachable)

var errLeaseExpired = errors.New("lease expired without an ack on every attempt (daemon crashed or stalled)")

// publishStage publishes claimed batches, merging those that queued up into
// one flush, and passes the outcome to the ack stage: delivered when
// published, retry, postpone or bury when not (outcome). Up to publishWorkers batches publish at
// once. On shutdown it finishes what was claimed.
func (s *Scanner) publishStage(ctx context.Context, in <-chan []claimed, out chan<- settled) {
	var wg sync.WaitGroup
	busy := make(chan struct{}, publishWorkers)
	for items := range in {
		busy <- struct{}{}
		// Merged after a worker freed up: what queued meanwhile goes out
		// in this one flush.
		items = drain(items, in, func(a, b []claimed) []claimed { return append(a, b...) })
		wg.Add(1)
		go func() {
			defer wg.Done()
			settles := s.publish(ctx, items)
			// The payloads are published (or given back): their bytes are
			// free, and only ids and tokens go on to the ack, which frees
			// the envelopes' overhead once they are written.
			held := int64(len(items)) * envelopeOverhead
			s.budget.published(bytesOf(items), held)
			out <- settled{byShard: settles, held: held}
			<-busy
		}()
	}
	wg.Wait()
}

func (s *Scanner) publish(ctx context.Context, items []claimed) map[int][]store.Settle {
	// A publish must end well inside its lease: once the lease expires,
	// another claim may deliver the envelope again, and a publish still
	// going on then would be a duplicate under the same attempt. So each
	// batch gets half the lease from its claim, and envelopes that waited
	// longer than that are given back unsent.
	deadline := time.Time{}
	for _, c := range items {
		if d := c.at.Add(s.opt.Lease / 2); deadline.IsZero() || d.Before(deadline) {
			deadline = d
		}
	}
	// As a timeout from Options.Now, which c.at was read from.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deadline.Sub(s.opt.Now()))
	defer cancel()
	ds := make([]envelope.Delivery, 0, len(items))
	from := make([]claimed, 0, len(items)) // from[i] was decoded into ds[i]
	settles := make(map[int][]store.Settle)
	var dead []envelope.Delivery // with the error in Delayd-Error
	settle := func(c claimed, d *envelope.Delivery, fail error) {
		st, letter := s.outcome(c, d, fail)
		settles[c.shard] = append(settles[c.shard], st)
		if letter != nil {
			dead = append(dead, *letter)
		}
	}
	for _, c := range items {
		if c.held != nil {
			// Given back as it is, not even decoded: it is not sent.
			settles[c.shard] = append(settles[c.shard], store.Settle{ID: c.ID, Token: c.Token, Outcome: store.Postpone,
				Error: c.held.Error(), RetryDelay: c.retryIn})
			continue
		}
		e, err := envelope.Decode(c.Data)
		if err != nil {
			// Keep it rather than drop it: it retries until max attempts and
			// then sits in the dead set for inspection.
			s.log.Error("stored envelope cannot be decoded", "id", c.ID, "shard", c.shard, "error", err)
			settle(c, nil, err)
			continue
		}
		d := envelope.Delivery{ID: c.ID, Due: time.UnixMilli(c.DueMs), Attempt: c.Attempt, Occurrence: c.Occurrence, Envelope: e}
		over := c.Attempt-c.Base > s.maxTries
		switch {
		case over && c.expired:
			// Claimed again after its leases expired without an ack: its
			// daemons died or stalled while delivering it. (Base: the
			// attempts before a replay, which granted a fresh budget.) The
			// longer budget of deliveries that found no subscriber, since
			// tries past MaxAttempts are expected then.
			settle(c, &d, errLeaseExpired)
		case over:
			// Claimed from due: its last attempt was retried under a
			// larger budget than this daemon's.
			settle(c, &d, fmt.Errorf("attempt %d is past the %d allowed now: scanner.max_attempts (or the no-interest retries) lowered since its last retry",
				c.Attempt-c.Base, s.maxTries))
		case dctx.Err() != nil:
			settle(c, &d, errStale)
		default:
			ds = append(ds, d)
			from = append(from, c)
		}
	}
	send := func(ds []envelope.Delivery, from []claimed) {
		smallFirst(ds, from)
		var errs []error
		if len(ds) > 0 {
			errs = s.pub.Publish(dctx, ds)
		}
		for i, c := range from {
			s.obs.Delivered(ds[i], errs[i])
			settle(c, &ds[i], errs[i])
		}
	}
	if g := s.opt.Gate; g != nil && len(ds) > 0 {
		// Targets no rule matches go out first: they do not wait for the
		// Redis round trip that decides on the others. A batch with none
		// is not split.
		ruled := slices.IndexFunc(ds, func(d envelope.Delivery) bool { return g.Ruled(d.Target) })
		if ruled >= 0 {
			var free, held []envelope.Delivery
			var freeFrom, heldFrom []claimed
			for i, d := range ds {
				if g.Ruled(d.Target) {
					held, heldFrom = append(held, d), append(heldFrom, from[i])
				} else {
					free, freeFrom = append(free, d), append(freeFrom, from[i])
				}
			}
			s.resumed(free)
			send(free, freeFrom)
			ds, from = s.admit(dctx, held, heldFrom, settles)
		} else {
			s.resumed(ds)
		}
	}
	send(ds, from)
	// Dead letters get their own deadline: the batch's may be spent, and
	// the envelopes are safely in the dead set whatever happens here.
	lctx, lcancel := context.WithTimeout(context.WithoutCancel(ctx), s.opt.Lease/2)
	defer lcancel()
	s.publishDead(lctx, dead)
	return settles
}

// resumed sets, on deliveries no rule holds now, when a pause that held
// them ended: their lateness counts from then, not from hours of pause.
func (s *Scanner) resumed(ds []envelope.Delivery) {
	for i := range ds {
		ds[i].Allowed = s.opt.Gate.Resumed(ds[i])
	}
}

// admit asks flow control which of ds (all of targets a rule matches) go
// out now. The others are given
// back without being sent, their attempts untouched: held until a limit's
// slot or a resume (store.Hold), or, when the rules' state cannot be read,
// postponed. It returns the deliveries that go, and from along with them.
func (s *Scanner) admit(ctx context.Context, ds []envelope.Delivery, from []claimed, settles map[int][]store.Settle) ([]envelope.Delivery, []claimed) {
	decs := s.opt.Gate.Admit(ctx, ds)
	if decs == nil {
		return ds, from
	}
	n := 0
	for i, dec := range decs {
		c := from[i]
		switch {
		case dec.HoldUntilMs > 0:
			settles[c.shard] = append(settles[c.shard], store.Settle{ID: c.ID, Token: c.Token, Outcome: store.Hold,
				HoldUntilMs: dec.HoldUntilMs})
		case dec.RetryIn > 0:
			settles[c.shard] = append(settles[c.shard], store.Settle{ID: c.ID, Token: c.Token, Outcome: store.Postpone,
				Error: dec.Why.Error(), RetryDelay: dec.RetryIn})
			if ok, n := s.flowLog.Note(1); ok {
				s.log.Warn("delivery postponed: flow control's state cannot be read", "id", c.ID, "error", dec.Why,
					"similar_not_logged", n-1)
			}
		default:
			ds[i].Allowed = dec.Allowed
			ds[n], from[n] = ds[i], c
			n++
		}
	}
	return ds[:n], from[:n]
}

// smallFirst moves the small envelopes of a batch before its large ones
// (largeEnvelope), each class in its order, and from along with them.
// The connection writes a batch's publishes one after the other, so a
// small envelope behind a few of 900 kB waited for their bytes; nothing
// promises an order among envelopes that are all due. A batch of small
// ones only, the usual case, is left as it is, at the cost of one pass.
func smallFirst(ds []envelope.Delivery, from []claimed) {
	large := 0
	for _, c := range from {
		if len(c.Data) >= largeEnvelope {
			large++
		}
	}
	if large == 0 || large == len(from) {
		return
	}
	type pair struct {
		d envelope.Delivery
		c claimed
	}
	big := make([]pair, 0, large)
	n := 0
	for i, c := range from {
		if len(c.Data) >= largeEnvelope {
			big = append(big, pair{ds[i], c})
			continue
		}
		ds[n], from[n] = ds[i], c
		n++
	}
	for _, p := range big {
		ds[n], from[n] = p.d, p.c
		n++
	}
}

// outcome maps a claimed envelope and the result of its publish (fail, nil
// when it was published) to the settle the ack stage writes, and, when it
// goes to the dead set and dead letters are published (DeadSubject), to
// its dead letter. d is the decoded delivery, nil when the stored value
// could not be decoded.
func (s *Scanner) outcome(c claimed, d *envelope.Delivery, fail error) (store.Settle, *envelope.Delivery) {
	st := store.Settle{ID: c.ID, Token: c.Token, Outcome: store.Delivered}
	if fail == nil && d != nil && d.Series == nil && d.Request != "" {
		// Its tombstone answers a resend of the same request (store.Ack).
		st.Request, st.SinceMs = d.Request, max(c.DueMs, d.Stored.UnixMilli())
	}
	switch {
	case fail == nil && d != nil && d.Series != nil:
		s.nextOccurrence(&st, *d)
	case errors.Is(fail, ErrUnreachable):
		st.Outcome, st.Error = store.Postpone, fail.Error()
		s.log.Debug("not sent, delivery postponed", "id", c.ID, "error", fail)
	case fail != nil:
		st.Outcome, st.Error = store.Retry, fail.Error()
		try, last := c.Attempt-c.Base, s.opt.MaxAttempts
		noInterest := d != nil && errors.Is(fail, ErrNoInterest)
		if noInterest {
			last = s.noInterestTries
		}
		if try >= last {
			st.Outcome = store.Bury
			target := ""
			var letter *envelope.Delivery
			if d != nil {
				target = d.Target
				if s.opt.DeadSubject != "" {
					dl := deadLetter(*d, s.opt.DeadSubject, fail)
					letter = &dl
				}
			}
			s.log.Warn("envelope moved to the dead set", "id", c.ID, "target", target, "attempts", c.Attempt, "error", fail)
			return st, letter
		}
		st.RetryDelay = s.opt.retryDelay(try)
		s.obs.Redelivered("retry", 1)
		if noInterest {
			s.log.Debug("delivery reached no subscriber, will retry", "id", c.ID, "attempt", c.Attempt, "retry_in", st.RetryDelay)
			if ok, n := s.noInterestLog.Note(1); ok {
				s.log.Warn("core NATS delivery reached no subscriber, will retry with backoff",
					"id", c.ID, "target", d.Target, "attempt", c.Attempt, "retry_in", st.RetryDelay, "similar_not_logged", n-1)
			}
		} else {
			s.log.Warn("delivery failed, will retry", "id", c.ID, "attempt", c.Attempt, "retry_in", st.RetryDelay, "error", fail)
		}
	}
	return st, nil
}

// nextOccurrence turns the ack of a delivered occurrence of a series into
// the move to its next one, which the ack script writes in the same step:
// a crash before the ack delivers this occurrence again (a higher attempt),
// never skips or doubles the next. "Now" is Redis time, as for due times;
// with the default catch-up, an occurrence delivered after an outage is
// followed by the first one after now, not by every one missed. A series
// without a next occurrence (its count or until reached) is deleted.
func (s *Scanner) nextOccurrence(st *store.Settle, d envelope.Delivery) {
	now := s.clock.nowMs()
	if now == 0 {
		now = s.opt.Now().UnixMilli()
	}
	occurrence := max(d.Occurrence, 1)
	// The rule runs on the unjittered times, so offsets never accumulate
	// and until bounds those; each occurrence then adds its own offset.
	// Catch-up skips a time only once its whole jitter is past: an
	// occurrence delivered on time at a large offset may be past the next
	// time, and is not late for it.
	base := d.Due.Add(-envelope.JitterOffset(d.ID, occurrence, d.Jitter))
	next, ok := d.Series.Next(base, time.UnixMilli(now).Add(-d.Jitter), occurrence)
	off := envelope.JitterOffset(d.ID, occurrence+1, d.Jitter)
	// The store keeps occurrence numbers in 4 bytes: a series ends at the
	// last one it can number (136 years of a 1 s period).
	if !ok || !next.Add(off).Before(envelope.MaxDue) || occurrence >= maxOccurrence {
		s.log.Debug("series finished", "id", d.ID, "occurrences", occurrence)
		return
	}
	st.Outcome, st.NextDueMs = store.Next, ceilMs(next)+off.Milliseconds()
}

// ceilMs is t in whole ms, rounded up: the store's due times are ms, and
// never early.
func ceilMs(t time.Time) int64 {
	ms := t.UnixMilli()
	if t.After(time.UnixMilli(ms)) {
		ms++
	}
	return ms
}

// deadLetter is the copy of a dead envelope published to
// <prefix>.<target>, with the last error in Delayd-Error.
func deadLetter(d envelope.Delivery, prefix string, fail error) envelope.Delivery {
	h := make(map[string][]string, len(d.Header)+1)
	for k, v := range d.Header {
		// Nats-* headers an operator let through (headers.allow_nats) were
		// meant for the target's stream, not for the dead-letter subject.
		if !envelope.IsNATSHeader(k) {
			h[k] = v
		}
	}
	h[envelope.HeaderError] = []string{fail.Error()}
	d.Header, d.Target = h, prefix+"."+d.Target
	return d
}

// publishDead tells whoever listens on <DeadSubject>.<target> about dead
// envelopes. It is best effort: the dead set in Redis is the record.
func (s *Scanner) publishDead(ctx context.Context, dead []envelope.Delivery) {
	if s.opt.DeadSubject == "" || len(dead) == 0 {
		return
	}
	for i, err := range s.pub.Publish(ctx, dead) {
		if err != nil {
			s.log.Warn("publishing dead letter failed; it stays in the dead set", "id", dead[i].ID, "subject", dead[i].Target, "error", err)
		}
	}
}
