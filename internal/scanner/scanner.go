// Package scanner is delayd's clock: it claims due envelopes, hands them to
// the publisher, and acks the published ones. It sleeps exactly until the
// next due time Redis reports, not on a fixed poll.
//
// One loop serves every shard: when it wakes, it claims from all the shards
// that are due in one Redis pipeline, however many they are. Claimed
// envelopes flow through two more stages, each a goroutine that merges
// whatever has queued up: publish (one flush for the lot) and ack (one
// pipeline). The stages overlap, so the clock claims again without waiting
// for the previous batch's flush and ack round trips.
package scanner

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
)

// Store is the part of the delay set the scanner drives.
type Store interface {
	Shards() int
	Claim(ctx context.Context, shards []int, o store.ClaimOptions) ([]store.ClaimResult, error)
	Ack(ctx context.Context, byShard map[int][]store.Settle, retry time.Duration) (store.Acked, error)
}

// Publisher delivers envelopes and confirms each: a nil error means the
// target has the message (core NATS: flushed; JetStream: PubAck). Errors
// wrapping ErrUnreachable mean nothing was written to the network; they do
// not count as delivery attempts. Any other error may follow a message
// that left the process, and counts; ErrNoInterest (the server saw no
// subscriber) gets a longer budget.
type Publisher interface {
	Publish(ctx context.Context, ds []envelope.Delivery) []error
	// Connected reports whether publishing can work now; while it cannot,
	// the scanner claims nothing, so no envelope waits under a lease or
	// burns its attempts during an outage.
	Connected() bool
}

// ErrUnreachable marks a publish error where the message was never written
// to the network (not connected when the batch was due). A message that
// may have left (a flush that timed out, a connection lost after the
// write) is an attempt, whatever happened to it.
var ErrUnreachable = errors.New("unreachable")

// Observer is told what happened, for metrics. Every method must be cheap.
type Observer interface {
	Delivered(d envelope.Delivery, err error)
	Claimed(shards int, took time.Duration)
	// Dead counts n envelopes the store confirmed moved to the dead set.
	Dead(n int)
	RedisError(op string)
	ShardsOwned(n int)
	// Redelivered counts n envelopes set to go out again, by cause
	// (lease_expiry, retry).
	Redelivered(cause string, n int)
	// UnknownFormat counts n stored values of a format newer than this
	// daemon reads, given back untouched for a daemon that reads it.
	UnknownFormat(format, n int)
}

// Options tune the scanner; see config.Scanner.
type Options struct {
	ClaimBatch int
	// ClaimBytes bounds the stored bytes one claim takes (0: no bound);
	// no claim starts while four claims' worth is between claim and the
	// end of its publish (memory.go).
	ClaimBytes   int64
	Lease        time.Duration
	IdleInterval time.Duration
	// RetryBackoff is the delay after a failed try, doubled per try of the
	// envelope up to RetryBackoffMax.
	RetryBackoff    time.Duration
	RetryBackoffMax time.Duration
	// MaxAttempts deliveries without success send an envelope to the dead
	// set.
	MaxAttempts int
	// NoInterestRetryFor: a delivery that found no subscriber
	// (ErrNoInterest) goes to the dead set only at the first try that
	// starts this long after its first by the backoff schedule, if that
	// is later than MaxAttempts. 0: MaxAttempts, as for every failure.
	NoInterestRetryFor time.Duration
	// DeadSubject, if set, is the prefix dead envelopes are also published
	// under: <DeadSubject>.<target>, with a Delayd-Error header.
	DeadSubject string
	// Shared: shards are owned through an Ownership and scanned only while
	// owned. Otherwise this scanner scans every shard.
	Shared bool
	// Announce, if set, tells the owner of a shard this daemon does not
	// own that an envelope falls due there (a cross-daemon wake-up).
	Announce func(shard int, dueMs int64)
}

// Scanner runs the claim/publish/ack loop over every shard.
type Scanner struct {
	store Store
	pub   Publisher
	obs   Observer
	opt   Options
	log   hclog.Logger
	// next[s] is the Redis time (ms) shard s must be claimed at: its next
	// due time or lease expiry. Wake lowers it from intake goroutines.
	next []atomic.Int64
	// owned[s]: this daemon scans shard s.
	owned []atomic.Bool
	// announced[s]: the earliest due time (ms) announced to the owner of
	// unowned shard s; no need to announce later ones until it passes.
	announced []atomic.Int64
	wake      chan struct{}
	// toPublish feeds the publish stage; only the Run loop sends.
	toPublish chan<- []claimed
	// clock maps local monotonic time to Redis time, from the last claim.
	clock redisClock
	// failing holds the backoff of shards whose claims fail; backoff is the
	// global one used before any claim succeeded; lastFailLog rate-limits
	// the warning. Only the Run loop touches them.
	failing     map[int]time.Duration
	backoff     time.Duration
	lastFailLog time.Time
	// budget bounds the bytes of claimed envelopes until their publish
	// ends.
	budget *byteBudget
	// unknown holds the stored formats met that this daemon cannot read,
	// each logged once. Only the Run loop touches it.
	unknown map[int]bool
	// short: claims published though their wait fell short (wait.go).
	short shortClaims
	// noInterestTries is the budget of a delivery nobody subscribed to,
	// maxTries the larger of it and MaxAttempts (see Options).
	noInterestTries, maxTries int
	// noInterestLog rate-limits the warning about deliveries that found
	// no subscriber: a consumer that is away makes one per envelope.
	noInterestLog rateLog
}

// New builds a scanner over every shard of st.
func New(st Store, pub Publisher, obs Observer, opt Options, log hclog.Logger) *Scanner {
	n := st.Shards()
	s := &Scanner{store: st, pub: pub, obs: obs, opt: opt, log: log,
		next: make([]atomic.Int64, n), owned: make([]atomic.Bool, n), announced: make([]atomic.Int64, n),
		wake: make(chan struct{}, 1), failing: map[int]time.Duration{},
		noInterestTries: opt.noInterestTries(), noInterestLog: rateLog{every: failLogEvery},
		budget: newByteBudget(opt.ClaimBytes)}
	s.maxTries = max(opt.MaxAttempts, s.noInterestTries)
	s.clock.base = time.Now()
	for i := range s.owned {
		s.owned[i].Store(!opt.Shared)
	}
	return s // next is all zero: every owned shard is claimed at start
}

// Owned lists the shards this daemon scans now.
func (s *Scanner) Owned() []int {
	var out []int
	for sh := range s.owned {
		if s.owned[sh].Load() {
			out = append(out, sh)
		}
	}
	return out
}

// SetOwned changes which shards this daemon scans. A newly owned shard is
// claimed at once: it may have been waiting for an owner.
func (s *Scanner) SetOwned(owned []bool) {
	n := 0
	for sh, own := range owned {
		if own {
			n++
		}
		if own && !s.owned[sh].Load() {
			s.next[sh].Store(0)
		}
		s.owned[sh].Store(own)
	}
	if s.obs != nil {
		s.obs.ShardsOwned(n)
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Wake tells the scanner that an envelope due at dueMs (Redis time) was
// stored in shard: it rescans at once if that is earlier than its plan, or,
// if another daemon owns the shard, announces it to that owner.
func (s *Scanner) Wake(shard int, dueMs int64) {
	if shard < 0 || shard >= len(s.next) {
		return
	}
	if !s.owned[shard].Load() {
		s.announce(shard, dueMs)
		return
	}
	s.WakeLocal(shard, dueMs)
}

// announce passes a due time to the shard's owner unless an earlier one,
// still in the future, was announced already: the owner's claim at that
// time returns the next due time, this one included.
func (s *Scanner) announce(shard int, dueMs int64) {
	if s.opt.Announce == nil {
		return
	}
	now := s.clock.nowMs()
	if now == 0 {
		now = time.Now().UnixMilli() // no claim yet to read Redis time from
	}
	for {
		prev := s.announced[shard].Load()
		if prev != 0 && prev > now && prev <= dueMs {
			return
		}
		if s.announced[shard].CompareAndSwap(prev, dueMs) {
			break
		}
	}
	s.opt.Announce(shard, dueMs)
}

// WakeLocal is Wake for a shard this daemon owns (or an announcement from
// another daemon): it never announces further.
func (s *Scanner) WakeLocal(shard int, dueMs int64) {
	if shard < 0 || shard >= len(s.next) || !s.owned[shard].Load() {
		return
	}
	for {
		cur := s.next[shard].Load()
		if dueMs >= cur {
			return
		}
		if s.next[shard].CompareAndSwap(cur, dueMs) {
			break
		}
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run scans until ctx is done. The batch being delivered when ctx ends is
// finished, so a stopping daemon leaves nothing claimed behind.
func (s *Scanner) Run(ctx context.Context) error {
	toPublish := make(chan []claimed, stageDepth)
	toAck := make(chan map[int][]store.Settle, stageDepth)
	acked := make(chan struct{})
	go func() {
		defer close(toAck)
		s.publishStage(ctx, toPublish, toAck)
	}()
	go func() {
		defer close(acked)
		s.ackStage(ctx, toAck)
	}()
	defer func() {
		close(toPublish)
		<-acked
	}()
	s.toPublish = toPublish
	paused := false
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	due := make([]int, 0, len(s.next))
	for ctx.Err() == nil {
		nowMs := s.clock.nowMs()
		due = due[:0]
		earliest := int64(math.MaxInt64)
		for sh := range s.next {
			if !s.owned[sh].Load() {
				continue
			}
			at := s.next[sh].Load()
			if at <= nowMs {
				due = append(due, sh)
			} else {
				earliest = min(earliest, at)
			}
		}
		if len(due) == 0 {
			if !s.sleep(ctx, timer, s.clock.until(earliest)) {
				return nil
			}
			continue
		}
		if !s.pub.Connected() {
			if !paused {
				s.log.Warn("NATS unreachable: deliveries paused until it is back")
				paused = true
			}
			if !s.sleep(ctx, timer, pausePoll) {
				return nil
			}
			continue
		}
		if paused {
			s.log.Info("NATS back: deliveries resumed")
			paused = false
		}
		if _, ok := s.budget.next(); !ok {
			// Claimed bytes are at their bound: claim again once a
			// publish ends, so large payloads cannot pile up in memory.
			select {
			case <-ctx.Done():
				return nil
			case <-s.budget.freed:
			case <-time.After(pausePoll):
			}
			continue
		}
		if err := s.scan(ctx, due); err != nil {
			// Only before the first claim ever succeeded, when there is no
			// Redis time to plan per-shard retries with.
			if ctx.Err() != nil {
				return nil
			}
			if !s.sleep(ctx, timer, s.backoff) {
				return nil
			}
		}
	}
	return nil
}

// scan claims from the due shards, delivers, and plans each shard's next
// claim.
func (s *Scanner) scan(ctx context.Context, shards []int) error {
	// Mark the shards as planned far ahead before claiming, so a Wake that
	// races with the claim lowers the plan again and is not lost.
	for _, sh := range shards {
		s.next[sh].Store(math.MaxInt64)
	}
	start := time.Now()
	bytes, _ := s.budget.next()
	res, err := s.store.Claim(ctx, shards, store.ClaimOptions{Batch: s.opt.ClaimBatch, Lease: s.opt.Lease, Bytes: bytes})
	if took := time.Since(start); took > 100*time.Millisecond {
		s.log.Debug("slow claim", "took", took, "shards", len(shards), "ok", len(res), "error", err)
	}
	if err != nil {
		s.redisError("claim")
		if now := time.Now(); now.Sub(s.lastFailLog) > failLogEvery {
			s.log.Warn("claim failed, retrying the failed shards with backoff", "failed", len(shards)-len(res),
				"of", len(shards), "error", err)
			s.lastFailLog = now
		}
		nowMs := s.clock.nowMs()
		if nowMs == 0 {
			// No Redis time yet to plan per-shard retries with: retry all
			// after a global backoff.
			s.backoff = nextBackoff(s.backoff)
			for _, sh := range shards {
				s.next[sh].Store(0)
			}
			return err
		}
		// The shards whose Redis node failed (all of them when Redis is
		// down, a Cluster master's while it fails over) each wait out a
		// growing backoff; the others go on as usual.
		got := make(map[int]bool, len(res))
		for _, r := range res {
			got[r.Shard] = true
		}
		for _, sh := range shards {
			if !got[sh] {
				b := nextBackoff(s.failing[sh])
				s.failing[sh] = b
				s.lower(sh, nowMs+b.Milliseconds())
			}
		}
	}
	s.backoff = 0
	for _, r := range res {
		delete(s.failing, r.Shard)
	}
	if len(s.failing) == 0 && !s.lastFailLog.IsZero() {
		s.log.Info("claims recovered on every shard")
		s.lastFailLog = time.Time{}
	}
	if len(res) == 0 {
		return nil
	}
	returned := time.Now()
	if s.obs != nil {
		s.obs.Claimed(len(shards), returned.Sub(start))
	}
	s.clock.set(res[0].NowMicros, returned)
	s.claimUnconfirmed(res)

	var items []claimed
	for _, r := range res {
		for _, c := range r.Items {
			items = append(items, claimed{shard: r.Shard, at: start, Claimed: c})
		}
		if r.Expired > 0 {
			s.redelivered("lease_expiry", r.Expired)
		}
		if r.Missing > 0 {
			s.log.Error("due ids without stored data were dropped (data deleted outside delayd?)", "shard", r.Shard, "count", r.Missing)
		}
		if r.Unknown > 0 {
			s.unknownFormat(r)
		}
		plan := r.NowMs() + s.opt.IdleInterval.Milliseconds()
		switch {
		case len(r.Items)+r.Missing >= s.opt.ClaimBatch:
			plan = 0 // more may be due right now
		default:
			for _, at := range []int64{r.NextDueMs, r.NextLeaseMs} {
				if at >= 0 {
					plan = min(plan, at)
				}
			}
		}
		s.lower(r.Shard, plan)
	}
	if len(items) > 0 {
		s.budget.take(bytesOf(items))
		s.toPublish <- items
	}
	return nil
}

// unknownFormat reports values of a format this daemon cannot read: a
// newer daemon wrote them while this one was not yet (or no longer)
// announced. They stay as they are, due again in a second, for a daemon
// that reads them.
func (s *Scanner) unknownFormat(r store.ClaimResult) {
	if s.obs != nil {
		s.obs.UnknownFormat(r.UnknownFormat, r.Unknown)
	}
	if s.unknown == nil {
		s.unknown = map[int]bool{}
	}
	if !s.unknown[r.UnknownFormat] {
		s.unknown[r.UnknownFormat] = true
		s.log.Warn("stored values of a newer format than this daemon reads are left for a daemon that reads it; "+
			"upgrade this daemon (logged once per format)", "format", r.UnknownFormat, "shard", r.Shard, "count", r.Unknown)
	}
}

// lower sets shard's plan to at unless a Wake already set an earlier one.
func (s *Scanner) lower(shard int, at int64) {
	for {
		cur := s.next[shard].Load()
		if at >= cur || s.next[shard].CompareAndSwap(cur, at) {
			return
		}
	}
}

type claimed struct {
	shard int
	// at is when the claim was sent: the lease started later, in Redis, so
	// a publish deadline counted from here can only be early, never late.
	at time.Time
	store.Claimed
}

// stageDepth is how many batches may wait between stages. Claimed
// envelopes wait there under their lease, so it stays small.
const stageDepth = 4

// publishWorkers is how many batches may be publishing at once. One would
// do for core NATS, whose confirmation is a flush round trip; but a
// JetStream target whose PubAcks are slow would hold every batch behind it,
// and a batch that waits spends its publish deadline (half the lease from
// its claim) waiting: it would fail, and fail again, though every publish
// it sends is acknowledged in time.
const publishWorkers = 4

// publishStage publishes claimed batches, merging those that queued up into
// one flush, and passes the outcome to the ack stage: ack when published,
// release for a retry when not. Up to publishWorkers batches publish at
// once. On shutdown it finishes what was claimed.
func (s *Scanner) publishStage(ctx context.Context, in <-chan []claimed, out chan<- map[int][]store.Settle) {
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
			// The payloads are published (or given back): only ids and
			// tokens go on to the ack.
			s.budget.release(bytesOf(items))
			out <- settles
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
	dctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	ds := make([]envelope.Delivery, 0, len(items))
	from := make([]claimed, 0, len(items)) // from[i] was decoded into ds[i]
	settles := make(map[int][]store.Settle)
	var dead []envelope.Delivery // with the error in Delayd-Error
	settle := func(c claimed, d *envelope.Delivery, fail error) {
		st := store.Settle{ID: c.ID, Token: c.Token, Outcome: store.Delivered}
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
				if d != nil {
					target = d.Target
					if s.opt.DeadSubject != "" {
						dead = append(dead, deadLetter(*d, s.opt.DeadSubject, fail))
					}
				}
				s.log.Warn("envelope moved to the dead set", "id", c.ID, "target", target, "attempts", c.Attempt, "error", fail)
			} else {
				st.RetryDelay = s.opt.retryDelay(try)
				s.redelivered("retry", 1)
				if noInterest {
					s.log.Debug("delivery reached no subscriber, will retry", "id", c.ID, "attempt", c.Attempt, "retry_in", st.RetryDelay)
					s.noInterestLog.warn(s.log, "core NATS delivery reached no subscriber, will retry with backoff",
						"id", c.ID, "target", d.Target, "attempt", c.Attempt, "retry_in", st.RetryDelay)
				} else {
					s.log.Warn("delivery failed, will retry", "id", c.ID, "attempt", c.Attempt, "retry_in", st.RetryDelay, "error", fail)
				}
			}
		}
		settles[c.shard] = append(settles[c.shard], st)
	}
	for _, c := range items {
		e, err := envelope.Decode(c.Data)
		if err != nil {
			// Keep it rather than drop it: it retries until max attempts and
			// then sits in the dead set for inspection.
			s.log.Error("stored envelope cannot be decoded", "id", c.ID, "shard", c.shard, "error", err)
			settle(c, nil, err)
			continue
		}
		d := envelope.Delivery{ID: c.ID, Due: time.UnixMilli(c.DueMs), Attempt: c.Attempt, Occurrence: c.Occurrence, Envelope: e}
		switch {
		case c.Attempt-c.Base > s.maxTries:
			// Claimed again after its leases expired without an ack: its
			// daemons died or stalled while delivering it. (Base: the
			// attempts before a replay, which granted a fresh budget.) The
			// longer budget of deliveries that found no subscriber, since
			// tries past MaxAttempts are expected then.
			settle(c, &d, errLeaseExpired)
		case dctx.Err() != nil:
			settle(c, &d, errStale)
		default:
			ds = append(ds, d)
			from = append(from, c)
		}
	}
	var errs []error
	if len(ds) > 0 {
		errs = s.pub.Publish(dctx, ds)
	}
	for i, c := range from {
		if s.obs != nil {
			s.obs.Delivered(ds[i], errs[i])
		}
		settle(c, &ds[i], errs[i])
	}
	// Dead letters get their own deadline: the batch's may be spent, and
	// the envelopes are safely in the dead set whatever happens here.
	lctx, lcancel := context.WithTimeout(context.WithoutCancel(ctx), s.opt.Lease/2)
	defer lcancel()
	s.publishDead(lctx, dead)
	return settles
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
		now = time.Now().UnixMilli()
	}
	occurrence := max(d.Occurrence, 1)
	next, ok := d.Series.Next(d.Due, time.UnixMilli(now), occurrence)
	// The store keeps occurrence numbers in 4 bytes: a series ends at the
	// last one it can number (136 years of a 1 s period).
	if !ok || !next.Before(envelope.MaxDue) || occurrence >= maxOccurrence {
		s.log.Debug("series finished", "id", d.ID, "occurrences", occurrence)
		return
	}
	// Whole ms, rounded up: the store's due times are ms, never early.
	ms := next.UnixMilli()
	if next.After(time.UnixMilli(ms)) {
		ms++
	}
	st.Outcome, st.NextDueMs = store.Next, ms
}

// maxOccurrence is the largest occurrence number the store keeps.
const maxOccurrence = 1<<32 - 1

// errStale: a batch waited so long for the publish stage that too little of
// its lease was left to publish safely. Nothing was sent.
var errStale = fmt.Errorf("claimed too long ago to publish within its lease: %w", ErrUnreachable)

var errLeaseExpired = errors.New("lease expired without an ack on every attempt (daemon crashed or stalled)")

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

// ackStage settles published batches, merging those that queued up into one
// pipeline.
func (s *Scanner) ackStage(ctx context.Context, in <-chan map[int][]store.Settle) {
	for settles := range in {
		settles = drain(settles, in, func(a, b map[int][]store.Settle) map[int][]store.Settle {
			for sh, v := range b {
				a[sh] = append(a[sh], v...)
			}
			return a
		})
		s.ack(ctx, settles)
	}
}

func (s *Scanner) redisError(op string) {
	if s.obs != nil {
		s.obs.RedisError(op)
	}
}

func (s *Scanner) redelivered(cause string, n int) {
	if s.obs != nil {
		s.obs.Redelivered(cause, n)
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

func (s *Scanner) ack(ctx context.Context, settles map[int][]store.Settle) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opt.Lease)
	defer cancel()
	// Released envelopes are due again after their retry delay: plan their
	// shards' next claim for the earliest, as for a new envelope.
	again := map[int]time.Duration{} // shard → earliest retry delay
	nexts := map[int]int64{}         // shard → earliest next occurrence
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
		}
	}
	for try := 0; ; try++ {
		a, err := s.store.Ack(actx, settles, s.opt.RetryBackoff)
		// Counted as the store confirms: a stale settle (replaced,
		// cancelled or re-claimed meanwhile) buries nothing.
		if a.Buried > 0 && s.obs != nil {
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
			return
		}
		s.redisError("ack")
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

// sleep waits for d, a Wake, or ctx; it reports false when ctx is done.
func (s *Scanner) sleep(ctx context.Context, timer *time.Timer, d time.Duration) bool {
	d = min(d, s.opt.IdleInterval)
	if d <= 0 {
		return true
	}
	timer.Reset(d)
	select {
	case <-ctx.Done():
		timer.Stop()
		return false
	case <-s.wake:
		timer.Stop()
	case <-timer.C:
	}
	return true
}

// redisClock estimates Redis time from the local monotonic clock. It is
// anchored at the moment a claim reply arrived, which is after Redis read
// its clock, so the estimate runs slightly behind Redis: wake-ups are a
// little late, never early. The loop sets it; intake goroutines read it.
type redisClock struct {
	base        time.Time    // local monotonic origin
	redisMicros atomic.Int64 // Redis time at the anchor
	localNanos  atomic.Int64 // the anchor, as time since base
}

func (c *redisClock) set(redisMicros int64, local time.Time) {
	c.localNanos.Store(int64(local.Sub(c.base)))
	c.redisMicros.Store(redisMicros)
}

func (c *redisClock) nowMs() int64 {
	r := c.redisMicros.Load()
	if r == 0 {
		return 0 // before the first claim every plan of 0 is due
	}
	return (r + (time.Since(c.base).Nanoseconds()-c.localNanos.Load())/1000) / 1000
}

// until returns the local duration until Redis time atMs.
func (c *redisClock) until(atMs int64) time.Duration {
	r := c.redisMicros.Load()
	if atMs == math.MaxInt64 || r == 0 {
		return math.MaxInt64
	}
	elapsed := time.Since(c.base) - time.Duration(c.localNanos.Load())
	return time.Duration(atMs*1000-r)*time.Microsecond - elapsed
}

// failLogEvery rate-limits the claim-failure warning during an outage.
const failLogEvery = 5 * time.Second

// pausePoll is how often a scanner paused by a NATS outage looks again.
const pausePoll = 50 * time.Millisecond

const (
	minBackoff = 50 * time.Millisecond
	// maxBackoff caps retries of failing shards: a recovered Redis is
	// claimed from within a second, and an outage costs a pipeline a second.
	maxBackoff = time.Second
)

func nextBackoff(b time.Duration) time.Duration {
	if b == 0 {
		return minBackoff
	}
	return min(2*b, maxBackoff)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
