// Package scanner is delayd's clock: for each shard it claims due
// envelopes, hands them to the publisher, and acks the published ones. It
// sleeps exactly until the next due time Redis reports, not on a fixed poll.
package scanner

import (
	"context"
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
	Claim(ctx context.Context, shard, batch int, lease time.Duration, maxAttempts int) (store.ClaimResult, error)
	Ack(ctx context.Context, shard int, items []store.Settle, retry time.Duration) (int, error)
	Reap(ctx context.Context, shard, limit int) (int, error)
}

// Publisher delivers envelopes and confirms each: a nil error means the
// target has the message (core NATS: flushed; JetStream: PubAck).
type Publisher interface {
	Publish(ctx context.Context, ds []envelope.Delivery) []error
}

// Observer is told what happened, for metrics. Every method must be cheap.
type Observer interface {
	Delivered(d envelope.Delivery, err error)
	Claimed(shard int, took time.Duration)
	Dead(shard, n int)
}

// Options tune the scanner; see config.Scanner.
type Options struct {
	ClaimBatch   int
	Lease        time.Duration
	IdleInterval time.Duration
	RetryBackoff time.Duration
	MaxAttempts  int
	// Now is the local clock, only used to measure lateness for the
	// observer; due decisions are made in Redis time.
	Now func() time.Time
}

// Scanner runs one loop per shard.
type Scanner struct {
	store  Store
	pub    Publisher
	obs    Observer
	opt    Options
	log    hclog.Logger
	shards []shardState
}

type shardState struct {
	// next is the Redis time (ms) the loop plans to claim again;
	// MaxInt64 while it is claiming, so any wake-up then forces a rescan.
	next atomic.Int64
	wake chan struct{}
}

// New builds a scanner over every shard of st.
func New(st Store, pub Publisher, obs Observer, opt Options, log hclog.Logger) *Scanner {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	s := &Scanner{store: st, pub: pub, obs: obs, opt: opt, log: log, shards: make([]shardState, st.Shards())}
	for i := range s.shards {
		s.shards[i].wake = make(chan struct{}, 1)
		s.shards[i].next.Store(math.MaxInt64)
	}
	return s
}

// Wake tells the shard's loop that an envelope due at dueMs (Redis time) was
// stored; the loop rescans at once if that is earlier than its plan.
func (s *Scanner) Wake(shard int, dueMs int64) {
	if shard < 0 || shard >= len(s.shards) {
		return
	}
	st := &s.shards[shard]
	if dueMs < st.next.Load() {
		select {
		case st.wake <- struct{}{}:
		default:
		}
	}
}

// Run scans until ctx is done, then lets each loop finish the batch it is
// delivering, so nothing claimed is left waiting for its lease to expire.
func (s *Scanner) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for sh := range s.shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.loop(ctx, sh)
		}()
	}
	wg.Wait()
	return nil
}

func (s *Scanner) loop(ctx context.Context, sh int) {
	st := &s.shards[sh]
	log := s.log.With("shard", sh)
	var backoff time.Duration
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for ctx.Err() == nil {
		st.next.Store(math.MaxInt64)
		start := time.Now()
		res, err := s.store.Claim(ctx, sh, s.opt.ClaimBatch, s.opt.Lease, s.opt.MaxAttempts)
		claimedAt := time.Now()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			backoff = nextBackoff(backoff)
			if backoff == minBackoff {
				log.Warn("claim failed, backing off", "error", err)
			}
			sleep(ctx, backoff)
			continue
		}
		if backoff > 0 {
			log.Info("claim recovered")
			backoff = 0
		}
		if s.obs != nil {
			s.obs.Claimed(sh, claimedAt.Sub(start))
		}
		if res.Dead > 0 {
			log.Warn("envelopes moved to dead after max attempts", "count", res.Dead, "max_attempts", s.opt.MaxAttempts)
			if s.obs != nil {
				s.obs.Dead(sh, res.Dead)
			}
		}
		if len(res.Items) > 0 {
			s.deliver(ctx, sh, res.Items, log)
		}
		if res.NextLeaseMs >= 0 && res.NextLeaseMs <= res.NowMs {
			if n, err := s.store.Reap(ctx, sh, s.opt.ClaimBatch); err != nil {
				log.Warn("reap failed", "error", err)
			} else if n > 0 {
				log.Info("returned envelopes with expired leases", "count", n)
			}
			continue
		}
		if len(res.Items) == s.opt.ClaimBatch {
			continue // more may be due right now
		}

		wait := s.opt.IdleInterval
		for _, at := range []int64{res.NextDueMs, res.NextLeaseMs} {
			if at >= 0 {
				wait = min(wait, time.Duration(at-res.NowMs)*time.Millisecond)
			}
		}
		// The plan is in Redis time; the timer runs on the local monotonic
		// clock from the moment the claim returned, which is no earlier than
		// the Redis "now" it reported, so the wake-up is never early.
		wait -= time.Since(claimedAt)
		st.next.Store(res.NowMs + (time.Since(claimedAt) + wait).Milliseconds())
		if wait <= 0 {
			continue
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-st.wake:
			timer.Stop()
		case <-timer.C:
		}
	}
}

// deliver publishes claimed envelopes and settles them: ack when published,
// release for a retry when not. It runs to completion even during shutdown
// (bounded by the lease), so a stopping daemon leaves nothing claimed.
func (s *Scanner) deliver(ctx context.Context, sh int, items []store.Claimed, log hclog.Logger) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opt.Lease)
	defer cancel()
	ds := make([]envelope.Delivery, 0, len(items))
	settles := make([]store.Settle, 0, len(items))
	var corrupt []store.Settle
	for _, c := range items {
		e, err := envelope.Decode(c.Data)
		if err != nil {
			// Keep it rather than drop it: released, it retries until
			// max attempts and then sits in the dead set for inspection.
			log.Error("stored envelope cannot be decoded", "id", c.ID, "error", err)
			corrupt = append(corrupt, store.Settle{ID: c.ID, Version: envelope.Version(c.Data), Release: true})
			continue
		}
		ds = append(ds, envelope.Delivery{ID: c.ID, Due: time.UnixMilli(c.DueMs), Attempt: c.Attempt, Envelope: e})
		settles = append(settles, store.Settle{ID: c.ID, Version: envelope.Version(c.Data)})
	}
	errs := s.pub.Publish(dctx, ds)
	for i, d := range ds {
		if errs[i] != nil {
			settles[i].Release = true
			log.Warn("delivery failed, will retry", "id", d.ID, "target", d.Target, "attempt", d.Attempt, "error", errs[i])
		}
		if s.obs != nil {
			s.obs.Delivered(d, errs[i])
		}
	}
	settles = append(settles, corrupt...)
	for try := 0; ; try++ {
		_, err := s.store.Ack(dctx, sh, settles, s.opt.RetryBackoff)
		if err == nil {
			return
		}
		if try == 2 || dctx.Err() != nil {
			// The leases expire and the envelopes are delivered again:
			// a duplicate, never a loss.
			log.Error("ack failed, envelopes will be redelivered after their lease", "count", len(settles), "error", err)
			return
		}
		sleep(dctx, time.Duration(try+1)*50*time.Millisecond)
	}
}

const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = 5 * time.Second
)

func nextBackoff(b time.Duration) time.Duration {
	if b == 0 {
		return minBackoff
	}
	return min(2*b, maxBackoff)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
