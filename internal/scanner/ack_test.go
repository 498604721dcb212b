package scanner

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// recObserver counts what the scanner reports.
type recObserver struct {
	nopObserver
	mu          sync.Mutex
	dead        int
	redisErrors map[string]int
}

func (o *recObserver) Dead(n int) { o.mu.Lock(); o.dead += n; o.mu.Unlock() }
func (o *recObserver) RedisError(op string) {
	o.mu.Lock()
	if o.redisErrors == nil {
		o.redisErrors = map[string]int{}
	}
	o.redisErrors[op]++
	o.mu.Unlock()
}

// ackStore answers acks with what the test sets, counting the calls and
// keeping what each was asked to settle.
type ackStore struct {
	claimStore
	acked store.Acked
	err   error
	calls int
	asked []map[int][]store.Settle
	// then, if set, answers the calls after the first.
	then *store.Acked
}

func (a *ackStore) Ack(_ context.Context, byShard map[int][]store.Settle, _ time.Duration) (store.Acked, error) {
	a.calls++
	a.asked = append(a.asked, byShard)
	if a.calls > 1 && a.then != nil {
		return *a.then, nil
	}
	return a.acked, a.err
}

// After an ack the scanner plans a shard at its series' next occurrence
// (the earliest of them) and counts the dead the store confirmed, not the
// buries it asked for.
func TestAckPlansNextOccurrencesAndCountsDead(t *testing.T) {
	t.Parallel()
	st := &ackStore{claimStore: claimStore{shards: 2}, acked: store.Acked{Settled: 3, Buried: 1, NowMs: 1_000_000}}
	obs := &recObserver{}
	s := New(st, newSwitchPub(), obs, defaultOpts, hclog.NewNullLogger())
	for sh := range s.next {
		s.next[sh].Store(math.MaxInt64)
	}
	s.ack(context.Background(), map[int][]store.Settle{
		0: {{ID: "a", Outcome: store.Next, NextDueMs: 1_060_000}, {ID: "b", Outcome: store.Next, NextDueMs: 1_030_000}},
		1: {{ID: "c", Outcome: store.Bury}, {ID: "d", Outcome: store.Bury}},
	})
	if got := s.next[0].Load(); got != 1_030_000 {
		t.Errorf("shard 0 planned at %d, want its earliest next occurrence 1030000", got)
	}
	if got := s.next[1].Load(); got != math.MaxInt64 {
		t.Errorf("shard 1 (buried only) planned at %d", got)
	}
	if obs.dead != 1 {
		t.Errorf("%d dead counted, want the 1 the store confirmed", obs.dead)
	}
}

// A failed ack is tried once more, then left to the leases (the envelopes
// are delivered again: a duplicate, never a loss); nothing is planned from
// a failed ack.
func TestAckFailureTriedTwice(t *testing.T) {
	t.Parallel()
	settles := map[int][]store.Settle{0: {{ID: "a", Outcome: store.Retry, RetryDelay: time.Second}}}
	st := &ackStore{claimStore: claimStore{shards: 1}, err: errors.New("store: ack: i/o timeout"),
		acked: store.Acked{Unsettled: settles}}
	obs := &recObserver{}
	s := New(st, newSwitchPub(), obs, defaultOpts, hclog.NewNullLogger())
	s.next[0].Store(math.MaxInt64)
	s.ack(context.Background(), settles)
	if st.calls != 2 || obs.redisErrors["ack"] != 2 {
		t.Errorf("%d ack calls, %d errors counted; want 2 and 2", st.calls, obs.redisErrors["ack"])
	}
	if got := s.next[0].Load(); got != math.MaxInt64 {
		t.Errorf("planned at %d after a failed ack", got)
	}
}

// A failed ack's retry sends only what the store says it did not settle;
// the shards of every release are planned once it succeeds.
func TestAckRetrySendsOnlyWhatWasNotSettled(t *testing.T) {
	t.Parallel()
	left := map[int][]store.Settle{1: {{ID: "b", Outcome: store.Retry, RetryDelay: time.Second}}}
	st := &ackStore{claimStore: claimStore{shards: 2}, err: errors.New("store: ack: shard 1 failed"),
		acked: store.Acked{Settled: 1, NowMs: 1_000_000, Unsettled: left}, then: &store.Acked{Settled: 1, NowMs: 1_000_000}}
	obs := &recObserver{}
	s := New(st, newSwitchPub(), obs, defaultOpts, hclog.NewNullLogger())
	for sh := range s.next {
		s.next[sh].Store(math.MaxInt64)
	}
	all := map[int][]store.Settle{
		0: {{ID: "a", Outcome: store.Retry, RetryDelay: 2 * time.Second}},
		1: {{ID: "b", Outcome: store.Retry, RetryDelay: time.Second}},
	}
	s.ack(context.Background(), all)
	if st.calls != 2 || obs.redisErrors["ack"] != 1 {
		t.Fatalf("%d ack calls, %d errors counted; want 2 and 1", st.calls, obs.redisErrors["ack"])
	}
	if len(st.asked[1]) != 1 || len(st.asked[1][1]) != 1 || st.asked[1][1][0].ID != "b" {
		t.Errorf("the retry sent %+v, want only shard 1's b", st.asked[1])
	}
	if got := s.next[0].Load(); got != 1_002_000 {
		t.Errorf("shard 0 planned at %d, want its release's 1002000", got)
	}
	if got := s.next[1].Load(); got != 1_001_000 {
		t.Errorf("shard 1 planned at %d, want its release's 1001000", got)
	}
}

// On the real store, where the attempt count across leases is the
// script's: an envelope whose daemons keep dying while delivering it (each
// claim's lease expires unacked) is, once past max_attempts, buried unsent
// by the next scanner to claim it, with only the dead letter published.
func TestLeaseExpiredBuriedUnsent(t *testing.T) {
	t.Parallel()
	r := testutil.StartRedis(t)
	st := store.New(store.NewClient(store.Options{Addrs: []string{r.Addr}}), "scan", 1)
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	data := envelope.Encode(envelope.Envelope{Target: "orders.x", Payload: []byte("p")})
	if _, errs := st.Schedule(ctx, []store.Item{{ID: "a", Data: data}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	const lease = 50 * time.Millisecond
	opt := Options{ClaimBatch: 10, Lease: lease, IdleInterval: 20 * time.Millisecond, RetryBackoff: time.Second,
		MaxAttempts: 2, DeadSubject: "delayd.dead"}
	// Two daemons claim it and die, each before its ack.
	for attempt := 1; attempt <= opt.MaxAttempts; attempt++ {
		eventually(t, "the envelope is handed out again", func() bool {
			res, err := st.Claim(ctx, []int{0}, store.ClaimOptions{Batch: 10, Lease: lease})
			if err != nil {
				t.Fatal(err)
			}
			return len(res) == 1 && len(res[0].Items) == 1 && res[0].Items[0].Attempt == attempt
		})
	}
	pub := &recPub{}
	s := New(st, pub, nil, opt, hclog.NewNullLogger())
	run(t, s)
	var e store.Entry
	eventually(t, "the envelope is dead", func() bool {
		var err error
		e, err = st.Get(ctx, "a")
		if errors.Is(err, store.ErrNotFound) {
			t.Fatal("the envelope was delivered and acked, not buried")
		}
		return err == nil && e.State == store.StateDead
	})
	if e.Attempts != opt.MaxAttempts+1 || !strings.Contains(e.Error, "lease expired") {
		t.Errorf("dead after %d attempts with error %q; want %d and the expired lease", e.Attempts, e.Error, opt.MaxAttempts+1)
	}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	if len(pub.got) != 1 || len(pub.got[0]) != 1 || pub.got[0][0].Target != "delayd.dead.orders.x" {
		t.Errorf("published %+v, want only the dead letter", pub.got)
	}
}

// Options.Acked is told the ids of every settle the store wrote, once the
// whole batch is written (after a retry too), and never of a batch left to
// the leases: it is what a test waits on for an ack nothing outside shows.
func TestAckedSignalsWrittenSettles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		st   *ackStore
		want []string
	}{
		{"written", &ackStore{claimStore: claimStore{shards: 2}, acked: store.Acked{Settled: 1, NowMs: 1_000_000}},
			[]string{"a", "b"}},
		{"written on the retry", &ackStore{claimStore: claimStore{shards: 2}, err: errors.New("store: ack: shard 1 failed"),
			acked: store.Acked{Settled: 1, NowMs: 1_000_000, Unsettled: map[int][]store.Settle{1: {{ID: "b", Outcome: store.Delivered}}}},
			then:  &store.Acked{Settled: 1, NowMs: 1_000_000}}, []string{"a", "b"}},
		{"failed twice", &ackStore{claimStore: claimStore{shards: 2}, err: errors.New("store: ack: i/o timeout"),
			acked: store.Acked{Unsettled: map[int][]store.Settle{0: {{ID: "a", Outcome: store.Delivered}}, 1: {{ID: "b", Outcome: store.Delivered}}}}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			opt := defaultOpts
			opt.Acked = func(ids []string) { got = append(got, ids...) }
			s := New(tc.st, newSwitchPub(), nil, opt, hclog.NewNullLogger())
			// a is stale (replaced meanwhile, the store ignores it): written all the same.
			s.ack(context.Background(), map[int][]store.Settle{
				0: {{ID: "a", Outcome: store.Delivered}},
				1: {{ID: "b", Outcome: store.Delivered}},
			})
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("Acked told of %q, want %q", got, tc.want)
			}
		})
	}
}
