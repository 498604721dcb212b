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
//
// By stage: loop.go claims and plans each shard's next claim (and its
// backoff while claims fail), deliver.go publishes and maps each result to
// its outcome, ack.go settles, clock.go estimates Redis time. owner.go
// holds shard ownership, backoff.go the retry delays of failed deliveries.
package scanner

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/flow"
	"github.com/delayd/delayd/internal/ratelog"
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
// wrapping ErrUnreachable mean NATS was unreachable: nothing was written,
// or it was written into a silent path (nothing came back at all); they do
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

// ErrUnreachable marks a publish error during a NATS outage: the message
// was never written (not connected when the batch was due), or written
// into a path that proved silent (no answer to the batch's flush nor to a
// probe after it, or pings unanswered: the bridge's errSilent). Any other
// message that may have left (a flush answered late, a connection closed
// by the server after the write) is an attempt, whatever happened to it.
var ErrUnreachable = errors.New("unreachable")

// Gate is flow control (flow.Gate): which claimed envelopes go out now,
// and what becomes of the others. Nil decisions: all go.
type Gate interface {
	// Ruled reports, from memory, whether a rule matches target.
	Ruled(target string) bool
	Admit(ctx context.Context, ds []envelope.Delivery) []flow.Decision
	// Resumed is when a pause that held d ended, if after d was due:
	// its lateness counts from then (zero: none).
	Resumed(d envelope.Delivery) time.Time
}

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

// nopObserver is the observer of a scanner built without one.
type nopObserver struct{}

func (nopObserver) Delivered(envelope.Delivery, error) {}
func (nopObserver) Claimed(int, time.Duration)         {}
func (nopObserver) Dead(int)                           {}
func (nopObserver) RedisError(string)                  {}
func (nopObserver) ShardsOwned(int)                    {}
func (nopObserver) Redelivered(string, int)            {}
func (nopObserver) UnknownFormat(int, int)             {}

// Options tune the scanner; see config.Scanner.
type Options struct {
	ClaimBatch int
	// ClaimBytes bounds the stored bytes one claim takes (0: no bound);
	// no claim starts while four claims' worth is between claim and the
	// end of its publish, or, counting each envelope's overhead, its ack
	// (memory.go).
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
	// StrictClaims: a claim whose wait for replicas fell short
	// (redis.wait_claims: strict) is not published but given back
	// uncounted, so no failover can repeat its attempt number. Otherwise
	// it is published, and warned about.
	StrictClaims bool
	// Shared: shards are owned through an Ownership and scanned only while
	// owned. Otherwise this scanner scans every shard.
	Shared bool
	// Gate, if set, holds back deliveries to limited or paused targets.
	Gate Gate
	// Announce, if set, tells the owner of a shard this daemon does not
	// own that an envelope falls due there (a cross-daemon wake-up).
	Announce func(shard int, dueMs int64)
	// Acked, if set, is told the ids of each batch of settles once the
	// store has written them all (applied, or ignored as stale: replaced,
	// cancelled or re-claimed meanwhile); never of a batch left to the
	// leases. Tests wait on it for an ack nothing outside the daemon
	// shows. It runs on the ack stage: it must not block.
	Acked func(ids []string)
	// Now is the local clock (default time.Now). Due times are Redis time;
	// the local clock only measures how long ago Redis said what time it
	// was. Injected so tests can move it.
	Now func() time.Time
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
	clock *redisClock
	// failing holds the backoff of shards whose claims fail; backoff is the
	// global one used before any claim succeeded; failLog limits the
	// warning. Only the Run loop touches them.
	failing map[int]time.Duration
	backoff time.Duration
	// unconfirmed holds the backoff of shards whose claims are given back
	// for a short wait (StrictClaims). Only the Run loop touches it.
	unconfirmed map[int]time.Duration
	failLog     *ratelog.Limiter
	// budget bounds the bytes of claimed envelopes until their publish
	// ends, and their overhead until acked; pauseLog limits the line
	// saying the clock waits for it.
	budget   *byteBudget
	pauseLog *ratelog.Limiter
	// unknown holds the stored formats met that this daemon cannot read,
	// each logged once. Only the Run loop touches it.
	unknown map[int]bool
	// shortLog limits the warning about claims published though their
	// wait fell short (wait.go), counting their envelopes.
	shortLog *ratelog.Limiter
	// noInterestTries is the budget of a delivery nobody subscribed to,
	// maxTries the larger of it and MaxAttempts (see Options).
	noInterestTries, maxTries int
	// noInterestLog rate-limits the warning about deliveries that found
	// no subscriber: a consumer that is away makes one per envelope.
	noInterestLog *ratelog.Limiter
	// flowLog rate-limits the warning about deliveries postponed because
	// flow control's state could not be read.
	flowLog *ratelog.Limiter
}

// New builds a scanner over every shard of st. A nil obs counts nothing.
func New(st Store, pub Publisher, obs Observer, opt Options, log hclog.Logger) *Scanner {
	if obs == nil {
		obs = nopObserver{}
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	n := st.Shards()
	s := &Scanner{store: st, pub: pub, obs: obs, opt: opt, log: log,
		next: make([]atomic.Int64, n), owned: make([]atomic.Bool, n), announced: make([]atomic.Int64, n),
		wake: make(chan struct{}, 1), failing: map[int]time.Duration{}, unconfirmed: map[int]time.Duration{},
		noInterestTries: opt.noInterestTries(), noInterestLog: ratelog.New(failLogEvery, opt.Now),
		flowLog: ratelog.New(failLogEvery, opt.Now),
		failLog: ratelog.New(failLogEvery, opt.Now), shortLog: ratelog.New(failLogEvery, opt.Now), pauseLog: ratelog.New(failLogEvery, opt.Now),
		budget: newByteBudget(opt.ClaimBytes), clock: newRedisClock(opt.Now)}
	s.maxTries = max(opt.MaxAttempts, s.noInterestTries)
	for i := range s.owned {
		s.owned[i].Store(!opt.Shared)
	}
	return s // next is all zero: every owned shard is claimed at start
}

// HeldBytes is what the claim byte budget holds now: the bytes of claimed
// envelopes not yet published (claims), and the overhead of published
// ones whose settles are not yet written (settles). Both are 0 when the
// scanner is idle.
func (s *Scanner) HeldBytes() (claims, settles int64) {
	return s.budget.claims.Load(), s.budget.settles.Load()
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
	s.obs.ShardsOwned(n)
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
		now = s.opt.Now().UnixMilli() // no claim yet to read Redis time from
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

// claimed is one envelope of a claim, with its shard and when it was
// claimed.
type claimed struct {
	shard int
	// at is when the claim was sent: the lease started later, in Redis, so
	// a publish deadline counted from here can only be early, never late.
	at time.Time
	// held, if not nil, is why it is given back unsent and uncounted (a
	// strict claim its wait did not confirm), due again in retryIn.
	held    error
	retryIn time.Duration
	// expired: re-claimed because its lease expired unacked, not claimed
	// from due (the first ClaimResult.Expired items of its shard).
	expired bool
	store.Claimed
}
