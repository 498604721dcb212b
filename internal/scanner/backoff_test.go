package scanner

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
)

// The defaults (config.Default): 1s doubling to 1m, 10 attempts, and a
// delivery nobody subscribes to retried for 10m.
var defaultOpts = Options{ClaimBatch: 256, Lease: 10 * time.Second, IdleInterval: time.Second,
	RetryBackoff: time.Second, RetryBackoffMax: time.Minute, MaxAttempts: 10, NoInterestRetryFor: 10 * time.Minute}

func TestRetryDelaySequence(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		name string
		opt  Options
		want []time.Duration // after try 1, 2, ...
	}{
		{"defaults", defaultOpts, []time.Duration{1 * s, 2 * s, 4 * s, 8 * s, 16 * s, 32 * s, 60 * s, 60 * s, 60 * s, 60 * s}},
		{"max a power of two", Options{RetryBackoff: 100 * time.Millisecond, RetryBackoffMax: 400 * time.Millisecond},
			[]time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 400 * time.Millisecond}},
		// A max below the base (a config from before the max existed that
		// set a long retry_backoff) keeps today's constant delay.
		{"max below base", Options{RetryBackoff: 2 * time.Minute, RetryBackoffMax: time.Minute},
			[]time.Duration{2 * time.Minute, 2 * time.Minute, 2 * time.Minute}},
		{"no max", Options{RetryBackoff: s}, []time.Duration{s, s}},
	} {
		for i, want := range tc.want {
			if got := tc.opt.retryDelay(i + 1); got != want {
				t.Errorf("%s: delay after try %d = %s, want %s", tc.name, i+1, got, want)
			}
		}
	}
	// No overflow however many tries, and a try below 1 (a replay's budget
	// counted from a base above the attempt, which the store never writes)
	// waits the base.
	huge := Options{RetryBackoff: time.Duration(math.MaxInt64 / 3), RetryBackoffMax: time.Duration(math.MaxInt64)}
	for _, try := range []int{1, 2, 3, 62, 63, 64, 1000, math.MaxInt} {
		if d := huge.retryDelay(try); d <= 0 || d > huge.RetryBackoffMax {
			t.Errorf("try %d: delay %d out of range", try, d)
		}
		if d := defaultOpts.retryDelay(try); d <= 0 || d > time.Minute {
			t.Errorf("defaults, try %d: delay %s out of range", try, d)
		}
	}
	if d := defaultOpts.retryDelay(0); d != time.Second {
		t.Errorf("try 0: %s, want the base", d)
	}
}

// The figures docs/protocol.md gives (Delivery guarantees): with the
// defaults, the 10th and last try of a failing delivery starts 4m3s after
// the first; a delivery nobody subscribes to is tried 16 times, the last
// 10m3s after the first.
func TestNoInterestBudget(t *testing.T) {
	start := func(o Options, try int) time.Duration { // nominal start of try, from the first
		var at time.Duration
		for k := 1; k < try; k++ {
			at += o.retryDelay(k)
		}
		return at
	}
	if got := start(defaultOpts, defaultOpts.MaxAttempts); got != 4*time.Minute+3*time.Second {
		t.Errorf("defaults: try %d starts %s after the first, docs/protocol.md says 4m3s", defaultOpts.MaxAttempts, got)
	}
	if n := defaultOpts.noInterestTries(); n != 16 {
		t.Errorf("defaults: %d tries without a subscriber, docs/protocol.md says 16", n)
	}
	if got := start(defaultOpts, 16); got != 10*time.Minute+3*time.Second {
		t.Errorf("defaults: try 16 starts %s after the first, docs/protocol.md says 10m3s", got)
	}
	for _, tc := range []struct {
		name string
		opt  Options
		want int
	}{
		{"off", Options{RetryBackoff: time.Second, RetryBackoffMax: time.Minute, MaxAttempts: 10}, 10},
		{"shorter than max_attempts covers", Options{RetryBackoff: time.Second, RetryBackoffMax: time.Minute, MaxAttempts: 10, NoInterestRetryFor: time.Minute}, 10},
		// 50, 100, then 200 ms: tries at 0, 50, 150, 350 ... 1150 ms.
		{"test timings", Options{RetryBackoff: 50 * time.Millisecond, RetryBackoffMax: 200 * time.Millisecond, MaxAttempts: 3, NoInterestRetryFor: time.Second}, 8},
		// docs/protocol.md's example: 0.1, 0.2, 0.4, 0.8 s, then 1 s: the 34th
		// try starts 30.5 s after the first.
		{"protocol.md example", Options{RetryBackoff: 100 * time.Millisecond, RetryBackoffMax: time.Second, MaxAttempts: 3, NoInterestRetryFor: 30 * time.Second}, 34},
		{"exactly on a try", Options{RetryBackoff: time.Second, RetryBackoffMax: time.Second, MaxAttempts: 1, NoInterestRetryFor: 5 * time.Second}, 6},
		// The constant tail is computed, not walked: a nanosecond backoff
		// over a day must not loop 8.64e13 times.
		{"tiny backoff", Options{RetryBackoff: 1, RetryBackoffMax: 1, MaxAttempts: 1, NoInterestRetryFor: time.Minute}, int(time.Minute) + 1},
	} {
		if got := tc.opt.noInterestTries(); got != tc.want {
			t.Errorf("%s: %d tries, want %d", tc.name, got, tc.want)
		}
		if tc.want > 1000 {
			continue
		}
		// By definition: the last try is the first to start at or after
		// the window.
		if w := tc.opt.NoInterestRetryFor; w > 0 && tc.want > tc.opt.MaxAttempts {
			if last, before := start(tc.opt, tc.want), start(tc.opt, tc.want-1); last < w || before >= w {
				t.Errorf("%s: try %d at %s, try %d at %s, window %s", tc.name, tc.want-1, before, tc.want, last, w)
			}
		}
	}
}

// errPub fails every delivery with err.
type errPub struct{ err error }

func (p errPub) Publish(_ context.Context, ds []envelope.Delivery) []error {
	errs := make([]error, len(ds))
	for i := range errs {
		errs[i] = p.err
	}
	return errs
}
func (errPub) Connected() bool { return true }

// What the scanner settles a failed delivery with, by its try number: a
// retry after the exponential delay of that try, or the dead set once the
// budget is spent. A delivery nobody subscribed to has the longer budget;
// any other failure keeps max_attempts, also after no-interest tries that
// went past it.
func TestSettleByTry(t *testing.T) {
	noInterest := fmt.Errorf("publish to orders.x: %w", ErrNoInterest)
	other := errors.New("flush not confirmed")
	data := envelope.Encode(envelope.Envelope{Target: "orders.x", Payload: []byte("p")})
	for _, tc := range []struct {
		err       error
		try, base int
		outcome   store.Outcome
		delay     time.Duration
	}{
		{other, 1, 0, store.Retry, time.Second},
		{other, 3, 0, store.Retry, 4 * time.Second},
		{other, 9, 0, store.Retry, time.Minute},
		{other, 10, 0, store.Bury, 0},
		{other, 12, 0, store.Bury, 0},                 // past max_attempts by no-interest tries
		{other, 12, 10, store.Retry, 2 * time.Second}, // a replay's fresh budget: try 2
		{noInterest, 1, 0, store.Retry, time.Second},
		{noInterest, 10, 0, store.Retry, time.Minute},
		{noInterest, 15, 0, store.Retry, time.Minute},
		{noInterest, 16, 0, store.Bury, 0},
		{ErrUnreachable, 5, 0, store.Postpone, 0}, // nothing sent: the base delay, attempt given back
	} {
		st := &claimStore{shards: 1}
		s := New(st, errPub{tc.err}, nil, defaultOpts, hclog.NewNullLogger())
		settles := s.publish(context.Background(), []claimed{{shard: 0, at: time.Now(),
			Claimed: store.Claimed{ID: "a", DueMs: 1000, Attempt: tc.try, Base: tc.base, Data: data, Token: "1.5"}}})
		got := settles[0]
		if len(got) != 1 || got[0].Outcome != tc.outcome || got[0].RetryDelay != tc.delay {
			t.Errorf("%v at try %d (base %d): settled %+v, want outcome %c delay %s", tc.err, tc.try, tc.base, got, tc.outcome, tc.delay)
		}
	}
}

// countPub counts the deliveries it is asked to make.
type countPub struct {
	mu sync.Mutex
	n  int
}

func (p *countPub) Publish(_ context.Context, ds []envelope.Delivery) []error {
	p.mu.Lock()
	p.n += len(ds)
	p.mu.Unlock()
	return make([]error, len(ds))
}
func (*countPub) Connected() bool { return true }

// An envelope claimed again after its leases expired is buried unsent once
// past its budget (its daemons keep dying on it); with the no-interest
// window, the budget is the longer of the two, since tries past
// max_attempts are then expected.
func TestLeaseExpiredBudget(t *testing.T) {
	data := envelope.Encode(envelope.Envelope{Target: "orders.x"})
	for _, tc := range []struct {
		opt     Options
		try     int
		publish bool
	}{
		{defaultOpts, 11, true},
		{defaultOpts, 16, true},
		{defaultOpts, 17, false},
		{Options{Lease: time.Second, RetryBackoff: time.Second, MaxAttempts: 10}, 11, false},
	} {
		pub := &countPub{}
		s := New(&claimStore{shards: 1}, pub, nil, tc.opt, hclog.NewNullLogger())
		settles := s.publish(context.Background(), []claimed{{shard: 0, at: time.Now(), expired: true,
			Claimed: store.Claimed{ID: "a", DueMs: 1000, Attempt: tc.try, Data: data, Token: "1.5"}}})
		if sent := pub.n == 1; sent != tc.publish {
			t.Errorf("try %d with %d tries without a subscriber: published %v, want %v (settled %+v)",
				tc.try, tc.opt.noInterestTries(), sent, tc.publish, settles[0])
		}
	}
}

// After settling retries, the scanner plans each shard's next claim at its
// earliest retry, not at the base delay: a shard whose retries all wait a
// minute is not claimed in vain every second.
func TestAckPlansTheEarliestRetry(t *testing.T) {
	st := &claimStore{shards: 3, nowMs: 1_000_000}
	s := New(st, &countPub{}, nil, defaultOpts, hclog.NewNullLogger())
	for sh := range s.next {
		s.next[sh].Store(math.MaxInt64)
	}
	s.ack(context.Background(), map[int][]store.Settle{
		0: {{ID: "a", Outcome: store.Retry, RetryDelay: 32 * time.Second}, {ID: "b", Outcome: store.Retry, RetryDelay: time.Minute}},
		1: {{ID: "c", Outcome: store.Postpone}}, // the base delay
		2: {{ID: "d", Outcome: store.Delivered}},
	})
	for sh, want := range []int64{1_032_000, 1_001_000, math.MaxInt64} {
		if got := s.next[sh].Load(); got != want {
			t.Errorf("shard %d planned at %d, want %d", sh, got, want)
		}
	}
}
