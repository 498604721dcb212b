package scanner

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// claimStore answers each claim with claim(shards), reports it on claims,
// and records the settles it is given.
type claimStore struct {
	shards int
	claim  func(shards []int) ([]store.ClaimResult, error)
	claims chan []int
	mu     sync.Mutex
	acks   []map[int][]store.Settle
	nowMs  int64 // the Redis time acks return
	// ackGate, if set, holds every Ack until it is closed.
	ackGate chan struct{}
}

func newClaimStore(shards int, claim func([]int) ([]store.ClaimResult, error)) *claimStore {
	return &claimStore{shards: shards, claim: claim, claims: make(chan []int, 16)}
}

func (f *claimStore) Shards() int { return f.shards }

func (f *claimStore) Claim(ctx context.Context, shards []int, _ store.ClaimOptions) ([]store.ClaimResult, error) {
	res, err := f.claim(shards)
	// Once the test falls behind reading, the loop waits for it: no claim
	// goes unreported.
	select {
	case f.claims <- append([]int(nil), shards...):
	case <-ctx.Done():
	}
	return res, err
}

func (f *claimStore) Ack(_ context.Context, byShard map[int][]store.Settle, _ time.Duration) (store.Acked, error) {
	if f.ackGate != nil {
		<-f.ackGate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.acks = append(f.acks, byShard)
	return store.Acked{NowMs: f.nowMs}, nil
}

// nextClaim waits for the scanner's next claim and returns its shards.
func (f *claimStore) nextClaim(t *testing.T) []int {
	t.Helper()
	select {
	case sh := <-f.claims:
		return sh
	case <-time.After(10 * time.Second):
		t.Fatal("no claim within 10s")
		return nil
	}
}

// switchPub publishes nothing and succeeds, while connected; every call
// of Connected is reported on asked (without blocking).
type switchPub struct {
	down  atomic.Bool
	asked chan bool
	sent  atomic.Int64
}

func newSwitchPub() *switchPub { return &switchPub{asked: make(chan bool, 1024)} }

func (p *switchPub) Publish(_ context.Context, ds []envelope.Delivery) []error {
	p.sent.Add(int64(len(ds)))
	return make([]error, len(ds))
}

func (p *switchPub) Connected() bool {
	up := !p.down.Load()
	select {
	case p.asked <- up:
	default:
	}
	return up
}

// run starts s.Run and stops it when the test ends.
func run(t *testing.T, s *Scanner) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// result is a claim result of shard at Redis time nowMicros with n
// claimed items, nothing else pending unless the test sets it.
func result(shard int, nowMicros int64, n int) store.ClaimResult {
	r := store.ClaimResult{Shard: shard, NowMicros: nowMicros, NextDueMs: -1, NextLeaseMs: -1}
	data := envelope.Encode(envelope.Envelope{Target: "orders.x", Payload: []byte("p")})
	for i := range n {
		r.Items = append(r.Items, store.Claimed{ID: "id" + strconv.Itoa(i), DueMs: nowMicros / 1000, Attempt: 1,
			Data: data, Token: "1.5"})
	}
	return r
}

func newTestScanner(st Store, pub Publisher, clock *testutil.Clock, opt Options) *Scanner {
	opt.Now = clock.Now
	return New(st, pub, nil, opt, hclog.NewNullLogger())
}

// eventually waits up to 10s for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.Wait(t, 10*time.Second, what, cond)
}
