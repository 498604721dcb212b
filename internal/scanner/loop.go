package scanner

// The clock loop: claim from the shards that are due, plan each shard's
// next claim from what its claim returned, and sleep until the earliest.

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/delayd/delayd/internal/store"
)

// failLogEvery is the least time between two lines of a recurring
// warning of the scanner (a claim failure during an outage, deliveries
// nobody subscribed to, claims their wait did not confirm).
const failLogEvery = 5 * time.Second

// pausePoll is how often a scanner paused by a NATS outage looks again.
const pausePoll = 50 * time.Millisecond

// Run scans until ctx is done. The batch being delivered when ctx ends is
// finished, so a stopping daemon leaves nothing claimed behind.
func (s *Scanner) Run(ctx context.Context) error {
	toPublish := make(chan []claimed, stageDepth)
	toAck := make(chan settled, stageDepth)
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
		var earliest int64
		due, earliest = s.dueShards(s.clock.nowMs(), due[:0])
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
			s.claimsPaused()
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

// claimsPaused says, at most once per failLogEvery, that the clock waits
// for claimed bytes to be published and settles to be written: under load
// a short wait is the bound at work; the same line every few seconds with
// nothing moving is a stall.
func (s *Scanner) claimsPaused() {
	ok, n := s.pauseLog.Note(1)
	if !ok {
		return
	}
	claims, settles := s.HeldBytes()
	s.log.Info("claims paused: claimed and unsettled envelopes hold the claim byte budget",
		"claims_held", claims, "settles_held", settles, "bound", inflightFactor*s.budget.limit, "waits", n)
}

// dueShards appends to due the owned shards whose plan has come at nowMs
// (Redis time), and returns the earliest plan of the others
// (math.MaxInt64 if none).
func (s *Scanner) dueShards(nowMs int64, due []int) ([]int, int64) {
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
	return due, earliest
}

// scan claims from the due shards, delivers, and plans each shard's next
// claim.
func (s *Scanner) scan(ctx context.Context, shards []int) error {
	// Mark the shards as planned far ahead before claiming, so a Wake that
	// races with the claim lowers the plan again and is not lost.
	for _, sh := range shards {
		s.next[sh].Store(math.MaxInt64)
	}
	start := s.opt.Now()
	bytes, _ := s.budget.next()
	res, err := s.store.Claim(ctx, shards, store.ClaimOptions{Batch: s.opt.ClaimBatch, Lease: s.opt.Lease, Bytes: bytes})
	if took := s.opt.Now().Sub(start); took > 100*time.Millisecond {
		s.log.Debug("slow claim", "took", took, "shards", len(shards), "ok", len(res), "error", err)
	}
	if err != nil && s.claimFailed(shards, res, err) {
		return err
	}
	s.backoff = 0
	for _, r := range res {
		delete(s.failing, r.Shard)
	}
	if len(s.failing) == 0 && s.failLog.Reset() {
		s.log.Info("claims recovered on every shard")
	}
	if len(res) == 0 {
		return nil
	}
	// After the reply arrived, so after Redis read its clock: the estimate
	// runs behind Redis, never ahead (clock.go).
	returned := s.opt.Now()
	s.obs.Claimed(len(shards), returned.Sub(start))
	s.clock.set(res[0].NowMicros, returned)
	s.claimUnconfirmed(res)

	var items []claimed
	for _, r := range res {
		plan := s.plan(r)
		var held error
		var retryIn time.Duration
		if r.Unconfirmed && s.opt.StrictClaims && len(r.Items) > 0 {
			// Given back, and the shard claimed again only after a
			// backoff: a backlog would otherwise be claimed and given back
			// in a hot loop while no replica confirms.
			held = fmt.Errorf("%w: %v", errUnconfirmedClaim, r.Why)
			retryIn = nextBackoff(s.unconfirmed[r.Shard])
			s.unconfirmed[r.Shard] = retryIn
			plan = max(plan, r.NowMs()+retryIn.Milliseconds())
		} else {
			delete(s.unconfirmed, r.Shard)
		}
		for i, c := range r.Items {
			items = append(items, claimed{shard: r.Shard, at: start, held: held, retryIn: retryIn, expired: i < r.Expired, Claimed: c})
		}
		if r.Expired > 0 {
			s.obs.Redelivered("lease_expiry", r.Expired)
		}
		if r.Missing > 0 {
			s.log.Error("due ids without stored data were dropped (data deleted outside delayd?)", "shard", r.Shard, "count", r.Missing)
		}
		if r.Unknown > 0 {
			s.unknownFormat(r)
		}
		s.lower(r.Shard, plan)
	}
	if len(items) > 0 {
		s.budget.take(bytesOf(items))
		s.toPublish <- items
	}
	return nil
}

// claimFailed plans the retries of the shards a claim failed for, and
// reports whether they all wait out the global backoff instead (no claim
// ever succeeded, so there is no Redis time to plan per shard with).
func (s *Scanner) claimFailed(shards []int, res []store.ClaimResult, err error) (global bool) {
	s.obs.RedisError(store.OpClaim)
	if ok, _ := s.failLog.Note(1); ok {
		s.log.Warn("claim failed, retrying the failed shards with backoff", "failed", len(shards)-len(res),
			"of", len(shards), "error", err)
	}
	nowMs := s.clock.nowMs()
	if nowMs == 0 {
		// No Redis time yet to plan per-shard retries with: retry all
		// after a global backoff.
		s.backoff = nextBackoff(s.backoff)
		for _, sh := range shards {
			s.next[sh].Store(0)
		}
		return true
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
	return false
}

// plan is when (Redis time, ms) to claim from a shard again after its
// claim returned r: at once if the claim was full (more may be due right
// now), else at its next due time or lease expiry, and at the latest an
// idle interval from now.
func (s *Scanner) plan(r store.ClaimResult) int64 {
	if len(r.Items)+r.Missing >= s.opt.ClaimBatch {
		return 0
	}
	plan := r.NowMs() + s.opt.IdleInterval.Milliseconds()
	for _, at := range []int64{r.NextDueMs, r.NextLeaseMs} {
		if at >= 0 {
			plan = min(plan, at)
		}
	}
	return plan
}

// unknownFormat reports values of a format this daemon cannot read: a
// newer daemon wrote them while this one was not yet (or no longer)
// announced. They stay as they are, due again in a second, for a daemon
// that reads them.
func (s *Scanner) unknownFormat(r store.ClaimResult) {
	s.obs.UnknownFormat(r.UnknownFormat, r.Unknown)
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
