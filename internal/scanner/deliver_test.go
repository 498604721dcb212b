package scanner

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/recur"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

var outcomeOpts = Options{ClaimBatch: 10, Lease: 10 * time.Second, IdleInterval: time.Second,
	RetryBackoff: time.Second, RetryBackoffMax: time.Minute, MaxAttempts: 3, DeadSubject: "delayd.dead"}

// What each claimed envelope and publish result settles as, and which of
// them send a dead letter. Series read "now" from the Redis clock, set
// here years away from the local one: a series computed on local time
// would be off by those years.
func TestOutcome(t *testing.T) {
	t.Parallel()
	const redisNow = int64(2_000_000_000_000) // ms
	failed := errors.New("flush not confirmed")
	unreachable := fmt.Errorf("publish: %w", ErrUnreachable)
	every := func(mod func(*recur.Rule)) *recur.Rule {
		r := &recur.Rule{Every: time.Minute}
		if mod != nil {
			mod(r)
		}
		return r
	}
	for _, tc := range []struct {
		name          string
		attempt, base int
		occurrence    int64
		dueMs         int64        // default redisNow - 1000
		series        *recur.Rule  // nil: a one-shot
		request       string       // the fingerprint of a publisher's one-shot (intake.dedupe_window)
		undecodable   bool         // the stored value is garbage
		noDeadSubject bool         // dead letters are not published
		fail          error        // the publish result
		want          store.Settle // ID and Token are filled in
		letter        bool         // a dead letter goes out
	}{
		{name: "delivered", attempt: 1, want: store.Settle{Outcome: store.Delivered}},
		{name: "delivered: its request's tombstone answers a resend", attempt: 1, request: "f1",
			want: store.Settle{Outcome: store.Delivered, Request: "f1", SinceMs: redisNow - 1000}},
		{name: "not delivered: no tombstone", attempt: 1, request: "f1", fail: failed,
			want: store.Settle{Outcome: store.Retry, Error: failed.Error(), RetryDelay: time.Second}},
		{name: "postponed: never sent", attempt: 2, fail: unreachable,
			want: store.Settle{Outcome: store.Postpone, Error: unreachable.Error()}},
		{name: "postponed: stale", attempt: 3, fail: errStale,
			want: store.Settle{Outcome: store.Postpone, Error: errStale.Error()}},
		{name: "retried after the first try", attempt: 1, fail: failed,
			want: store.Settle{Outcome: store.Retry, Error: failed.Error(), RetryDelay: time.Second}},
		{name: "retried, doubled", attempt: 2, fail: failed,
			want: store.Settle{Outcome: store.Retry, Error: failed.Error(), RetryDelay: 2 * time.Second}},
		{name: "retried: a replay's fresh budget", attempt: 5, base: 3, fail: failed,
			want: store.Settle{Outcome: store.Retry, Error: failed.Error(), RetryDelay: 2 * time.Second}},
		{name: "buried at max_attempts", attempt: 3, fail: failed,
			want: store.Settle{Outcome: store.Bury, Error: failed.Error()}, letter: true},
		{name: "buried, no dead subject", attempt: 3, fail: failed, noDeadSubject: true,
			want: store.Settle{Outcome: store.Bury, Error: failed.Error()}},
		{name: "buried on an expired lease", attempt: 4, fail: errLeaseExpired,
			want: store.Settle{Outcome: store.Bury, Error: errLeaseExpired.Error()}, letter: true},
		{name: "undecodable, retried", attempt: 1, undecodable: true, fail: errors.New("bad format"),
			want: store.Settle{Outcome: store.Retry, Error: "bad format", RetryDelay: time.Second}},
		{name: "undecodable, buried without a letter", attempt: 3, undecodable: true, fail: errors.New("bad format"),
			want: store.Settle{Outcome: store.Bury, Error: "bad format"}},
		{name: "series: the next occurrence", attempt: 1, occurrence: 1, series: every(nil),
			want: store.Settle{Outcome: store.Next, NextDueMs: redisNow - 1000 + 60_000}},
		{name: "series: after an outage, the first occurrence after Redis' now", attempt: 1, occurrence: 4,
			dueMs: redisNow - 630_000, series: every(nil),
			want: store.Settle{Outcome: store.Next, NextDueMs: redisNow + 30_000}},
		{name: "series: ends at its count", attempt: 1, occurrence: 3, series: every(func(r *recur.Rule) { r.Count = 3 }),
			want: store.Settle{Outcome: store.Delivered}},
		{name: "series: ends at until", attempt: 1, occurrence: 1,
			series: every(func(r *recur.Rule) { r.Until = time.UnixMilli(redisNow + 30_000) }),
			want:   store.Settle{Outcome: store.Delivered}},
		{name: "series: ends at the last occurrence number", attempt: 1, occurrence: maxOccurrence, series: every(nil),
			want: store.Settle{Outcome: store.Delivered}},
		{name: "series: a failed occurrence is retried", attempt: 1, occurrence: 1, series: every(nil), fail: failed,
			want: store.Settle{Outcome: store.Retry, Error: failed.Error(), RetryDelay: time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opt := outcomeOpts
			if tc.noDeadSubject {
				opt.DeadSubject = ""
			}
			clock := testutil.NewClock()
			s := newTestScanner(&claimStore{shards: 1}, newSwitchPub(), clock, opt)
			s.clock.set(redisNow*1000, clock.Now()) // years ahead of the local clock
			due := tc.dueMs
			if due == 0 {
				due = redisNow - 1000
			}
			c := claimed{shard: 0, at: clock.Now(), Claimed: store.Claimed{ID: "a", DueMs: due, Attempt: tc.attempt,
				Base: tc.base, Occurrence: tc.occurrence, Token: "7.1"}}
			var d *envelope.Delivery
			if !tc.undecodable {
				d = &envelope.Delivery{ID: "a", Due: time.UnixMilli(due), Attempt: tc.attempt, Occurrence: tc.occurrence,
					Envelope: envelope.Envelope{Target: "orders.x", Series: tc.series, Payload: []byte("p"), Request: tc.request,
						Header: map[string][]string{"Traceparent": {"00-1"}, "Nats-Msg-Id": {"forged"}}}}
			}
			got, letter := s.outcome(c, d, tc.fail)
			want := tc.want
			want.ID, want.Token = "a", "7.1"
			if got != want {
				t.Errorf("settled %+v, want %+v", got, want)
			}
			if (letter != nil) != tc.letter {
				t.Fatalf("dead letter %+v, want one: %v", letter, tc.letter)
			}
			if letter == nil {
				return
			}
			// The copy on <dead subject>.<target>: the payload and the
			// publisher's headers with the error, without Nats-* ones.
			wantHeader := map[string][]string{"Traceparent": {"00-1"}, envelope.HeaderError: {tc.fail.Error()}}
			if letter.Target != "delayd.dead.orders.x" || string(letter.Payload) != "p" || !reflect.DeepEqual(letter.Header, wantHeader) {
				t.Errorf("dead letter to %s, payload %q, header %v; want delayd.dead.orders.x, p, %v",
					letter.Target, letter.Payload, letter.Header, wantHeader)
			}
			if d.Target != "orders.x" || len(d.Header) != 2 {
				t.Errorf("the dead letter changed the delivery: %+v", d)
			}
		})
	}
}

// Due times in the store are whole ms: a next occurrence is rounded up,
// never down, so it is never early. (recur's rules give whole ms already;
// this is the scanner's own guard.)
func TestNextOccurrenceRoundsUp(t *testing.T) {
	t.Parallel()
	base := time.UnixMilli(1_700_000_000_123)
	for _, tc := range []struct {
		t    time.Time
		want int64
	}{
		{base, 1_700_000_000_123},
		{base.Add(time.Nanosecond), 1_700_000_000_124},
		{base.Add(999_999 * time.Nanosecond), 1_700_000_000_124},
		{base.Add(-time.Nanosecond), 1_700_000_000_123},
	} {
		if got := ceilMs(tc.t); got != tc.want {
			t.Errorf("ceilMs(%s) = %d, want %d", tc.t.Format(time.RFC3339Nano), got, tc.want)
		}
	}
}

// recPub records what it is asked to publish and succeeds.
type recPub struct {
	switchPub
	mu  sync.Mutex
	got [][]envelope.Delivery
}

func (p *recPub) Publish(_ context.Context, ds []envelope.Delivery) []error {
	p.mu.Lock()
	p.got = append(p.got, append([]envelope.Delivery(nil), ds...))
	p.mu.Unlock()
	return make([]error, len(ds))
}

// A batch that waited half its lease for the publish stage is given back
// unsent (a publish going on when the lease expires could duplicate under
// the same attempt), and its attempt is not counted; a batch with time
// left is published.
func TestStaleBatchPostponedUnsent(t *testing.T) {
	t.Parallel()
	data := envelope.Encode(envelope.Envelope{Target: "orders.x", Payload: []byte("p")})
	for _, tc := range []struct {
		name  string
		age   time.Duration // since the claim was sent
		stale bool
	}{
		{"half the lease ago", outcomeOpts.Lease / 2, true},
		{"longer ago", outcomeOpts.Lease, true},
		{"a quarter of the lease ago", outcomeOpts.Lease / 4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := testutil.NewClock()
			pub := &recPub{}
			s := newTestScanner(&claimStore{shards: 2}, pub, clock, outcomeOpts)
			at := clock.Now().Add(-tc.age)
			settles := s.publish(context.Background(), []claimed{
				{shard: 0, at: at, Claimed: store.Claimed{ID: "a", DueMs: 1, Attempt: 2, Data: data, Token: "1.1"}},
				{shard: 1, at: at, Claimed: store.Claimed{ID: "b", DueMs: 1, Attempt: 1, Data: data, Token: "1.2"}},
			})
			if !tc.stale {
				if len(pub.got) != 1 || len(pub.got[0]) != 2 || settles[0][0].Outcome != store.Delivered || settles[1][0].Outcome != store.Delivered {
					t.Fatalf("published %v, settled %+v; want both delivered", pub.got, settles)
				}
				return
			}
			if len(pub.got) != 0 {
				t.Fatalf("a stale batch was published: %v", pub.got)
			}
			for sh, id := range []string{"a", "b"} {
				want := []store.Settle{{ID: id, Token: fmt.Sprintf("1.%d", sh+1), Outcome: store.Postpone, Error: errStale.Error()}}
				if !reflect.DeepEqual(settles[sh], want) {
					t.Errorf("shard %d settled %+v, want %+v", sh, settles[sh], want)
				}
			}
		})
	}
}

// A claim whose wait fell short: published and counted by default;
// with StrictClaims not published but given back uncounted (postponed).
func TestUnconfirmedClaim(t *testing.T) {
	for _, strict := range []bool{false, true} {
		t.Run(map[bool]string{false: "deliver", true: "strict"}[strict], func(t *testing.T) {
			clock := testutil.NewClock()
			var once atomic.Bool
			st := newClaimStore(1, func([]int) ([]store.ClaimResult, error) {
				if once.Swap(true) {
					return nil, nil
				}
				r := result(0, clock.Now().UnixMicro(), 2)
				r.Unconfirmed, r.Why = true, errors.New("WAIT 1: 0 replicas")
				return []store.ClaimResult{r}, nil
			})
			pub := newSwitchPub()
			s := newTestScanner(st, pub, clock, Options{ClaimBatch: 10, Lease: time.Minute, IdleInterval: time.Hour,
				RetryBackoff: time.Second, MaxAttempts: 3, StrictClaims: strict})
			run(t, s)
			eventually(t, "both settled", func() bool {
				st.mu.Lock()
				defer st.mu.Unlock()
				return len(st.acks) > 0 && len(st.acks[0][0]) == 2
			})
			st.mu.Lock()
			settles := st.acks[0][0]
			st.mu.Unlock()
			want, sent := store.Delivered, int64(2)
			if strict {
				want, sent = store.Postpone, 0
			}
			if pub.sent.Load() != sent {
				t.Errorf("published %d, want %d", pub.sent.Load(), sent)
			}
			for _, x := range settles {
				if x.Outcome != want {
					t.Errorf("%s settled %q (%s), want %q", x.ID, x.Outcome, x.Error, want)
				}
			}
		})
	}
}

// Past its budget, an envelope is buried unsent, and the reason says why:
// re-claimed from an expired lease (the first Expired items of a shard's
// claim), its daemons crashed or stalled; claimed from due, its last
// attempt was retried under a larger budget, and scanner.max_attempts was
// lowered since (a graceful restart with a lower setting buried retrying
// envelopes as "lease expired", though nothing crashed).
func TestOverBudgetReason(t *testing.T) {
	clock := testutil.NewClock()
	var once atomic.Bool
	st := newClaimStore(1, func([]int) ([]store.ClaimResult, error) {
		if once.Swap(true) {
			return nil, nil
		}
		r := result(0, clock.Now().UnixMicro(), 2)
		r.Expired = 1 // "id0"
		for i := range r.Items {
			r.Items[i].Attempt = 4
		}
		return []store.ClaimResult{r}, nil
	})
	pub := newSwitchPub()
	opt := outcomeOpts
	opt.IdleInterval = time.Hour
	s := newTestScanner(st, pub, clock, opt)
	run(t, s)
	eventually(t, "both settled", func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return len(st.acks) > 0 && len(st.acks[0][0]) == 2
	})
	st.mu.Lock()
	settles := st.acks[0][0]
	st.mu.Unlock()
	for _, x := range settles {
		lease := strings.Contains(x.Error, "lease expired")
		lowered := strings.Contains(x.Error, "max_attempts") && strings.Contains(x.Error, "lowered")
		if x.Outcome != store.Bury || x.ID == "id0" && (!lease || lowered) || x.ID == "id1" && (lease || !lowered) {
			t.Errorf("%s settled %q: %q", x.ID, x.Outcome, x.Error)
		}
	}
	if n := pub.sent.Load(); n != 2 {
		t.Errorf("published %d, want the 2 dead letters alone", n)
	}
}

// In a batch that holds large envelopes, the small ones go out first:
// one connection writes a batch's publishes in order, so 2,000 small
// envelopes due with 100 of 900 kB waited behind them (issue 29, item
// 8). Each size class keeps its claim order, and every settle still
// names its own envelope.
func TestSmallPublishedBeforeLarge(t *testing.T) {
	t.Parallel()
	clock := testutil.NewClock()
	pub := &recPub{}
	s := newTestScanner(&claimStore{shards: 2}, pub, clock, outcomeOpts)
	small := envelope.Encode(envelope.Envelope{Target: "orders.x", Payload: []byte("p")})
	large := envelope.Encode(envelope.Envelope{Target: "orders.x", Payload: make([]byte, largeEnvelope)})
	var items []claimed
	for i, id := range []string{"L1", "s1", "L2", "s2", "s3"} {
		data := small
		if id[0] == 'L' {
			data = large
		}
		items = append(items, claimed{shard: i % 2, at: clock.Now(), Claimed: store.Claimed{ID: id, DueMs: 1, Attempt: 1, Data: data, Token: "1." + id}})
	}
	settles := s.publish(context.Background(), items)
	var order []string
	for _, d := range pub.got[0] {
		order = append(order, d.ID)
	}
	if want := []string{"s1", "s2", "s3", "L1", "L2"}; !slices.Equal(order, want) {
		t.Fatalf("published in the order %v, want %v", order, want)
	}
	for sh, sts := range settles {
		for _, st := range sts {
			if st.Token != "1."+st.ID || st.Outcome != store.Delivered {
				t.Errorf("shard %d: settle %+v", sh, st)
			}
		}
	}
	// Small ones only: the batch goes out as it came.
	pub.got = nil
	s.publish(context.Background(), []claimed{items[3], items[1]})
	if got := pub.got[0]; got[0].ID != "s2" || got[1].ID != "s1" {
		t.Fatalf("a batch of small envelopes was reordered: %s, %s", got[0].ID, got[1].ID)
	}
}
