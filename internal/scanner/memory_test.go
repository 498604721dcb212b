package scanner

import (
	"context"
	"math"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

func TestByteBudget(t *testing.T) {
	b := newByteBudget(100)
	if n, ok := b.next(); !ok || n != 100 {
		t.Fatalf("empty: %d %v", n, ok)
	}
	b.take(350)
	if n, ok := b.next(); !ok || n != 50 {
		t.Fatalf("350 held of 400: next claim %d %v, want the 50 left", n, ok)
	}
	b.take(80)
	if _, ok := b.next(); ok {
		t.Fatal("430 held: no claim may start")
	}
	b.published(430, 30)
	if n, ok := b.next(); !ok || n != 100 {
		t.Fatalf("30 held by settles: next claim %d %v, want a whole claim", n, ok)
	}
	b.acked(30)
	if claims, settles := b.claims.Load(), b.settles.Load(); claims != 0 || settles != 0 {
		t.Fatalf("all published and acked: claims %d, settles %d held", claims, settles)
	}
	select {
	case <-b.freed:
	default:
		t.Fatal("a release did not signal")
	}
	if n, ok := newByteBudget(0).next(); !ok || n != 0 {
		t.Fatalf("no bound: %d %v", n, ok)
	}
	items := []claimed{{Claimed: store.Claimed{Data: make([]byte, 7)}}, {Claimed: store.Claimed{Data: make([]byte, 5)}}}
	if n := bytesOf(items); n != 12+2*envelopeOverhead {
		t.Fatalf("bytesOf: %d, want the 12 stored bytes and two overheads", n)
	}
}

func TestAutoClaimBytesFollowsTheMemoryLimit(t *testing.T) {
	old := debug.SetMemoryLimit(math.MaxInt64)
	defer debug.SetMemoryLimit(old)
	// Without a limit, sized as for 64 MiB, the footprint delayd aims at
	// beside a pod: four claims of 8 MiB took the heap past it at 100k
	// due/s.
	if n := AutoClaimBytes(); n != 4<<20 {
		t.Fatalf("no limit: %d, want 4 MiB", n)
	}
	debug.SetMemoryLimit(96 << 20)
	if n := AutoClaimBytes(); n != 6<<20 {
		t.Fatalf("96 MiB limit: %d, want 6 MiB", n)
	}
	debug.SetMemoryLimit(512 << 20)
	if n := AutoClaimBytes(); n != 8<<20 {
		t.Fatalf("512 MiB limit: %d, want the 8 MiB at most", n)
	}
}

// Settles waiting for the ack stage hold their envelopes' overhead in the
// byte budget until they are written: behind a slow ack (resend
// tombstones at 100k due/s), publishing released the budget at once, the
// clock claimed on, and 60,000 settles queued for the ack besides the
// envelopes being claimed and published. With every ack held, the clock
// claims four claims' worth and then waits; once the acks go through, it
// claims again.
func TestSettlesHoldTheBudgetUntilAcked(t *testing.T) {
	t.Parallel()
	clock := testutil.NewClock()
	opt := loopOpts
	opt.IdleInterval = time.Hour
	one := result(0, 3_000_000_000, opt.ClaimBatch)
	// One claim's budget: a full claim's overhead. Its stored bytes,
	// freed once published, are not what stops the clock here.
	opt.ClaimBytes = int64(opt.ClaimBatch) * envelopeOverhead
	st := newClaimStore(1, func([]int) ([]store.ClaimResult, error) {
		return []store.ClaimResult{result(0, 3_000_000_000, opt.ClaimBatch)}, nil
	})
	st.ackGate = make(chan struct{})
	pub := newSwitchPub()
	var out testutil.Buffer
	opt.Now = clock.Now
	s := New(st, pub, nil, opt, hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Info}))
	run(t, s)
	opened := false
	open := func() {
		if !opened {
			opened = true
			close(st.ackGate)
		}
	}
	t.Cleanup(open) // before Run stops: its ack stage drains
	for range inflightFactor {
		st.nextClaim(t)
	}
	eventually(t, "every claimed envelope published", func() bool {
		return pub.sent.Load() == int64(inflightFactor*len(one.Items))
	})
	// The clock looks again (Connected is asked on every turn of its
	// loop) and does not claim while the settles wait.
	for range 3 {
		<-pub.asked
	}
	for len(pub.asked) > 0 {
		<-pub.asked
	}
	for range 3 {
		<-pub.asked
	}
	select {
	case sh := <-st.claims:
		t.Fatalf("claimed shards %v with %d claims' worth of settles not yet acked", sh, inflightFactor)
	default:
	}
	// The gauges show where the bytes are, and the log says why the clock
	// waits: once, however often it looked (its clock stood still).
	if claims, settles := s.HeldBytes(); claims != 0 || settles != inflightFactor*opt.ClaimBytes {
		t.Errorf("held: claims %d, settles %d; want 0 and %d", claims, settles, inflightFactor*opt.ClaimBytes)
	}
	if n := strings.Count(out.String(), "claims paused"); n != 1 {
		t.Errorf("%d lines \"claims paused\", want 1:\n%s", n, out.String())
	}
	open()
	st.nextClaim(t)
}

// Settles that queued up behind a slow ack are written in one pipeline,
// and free what every one of their batches held: a merge that kept only
// its first batch's overhead left the others' held for good, and once
// four claims' worth had leaked the clock never claimed again, silently.
func TestMergedAcksFreeTheirBudget(t *testing.T) {
	t.Parallel()
	st := &ackStore{claimStore: claimStore{shards: 1}}
	s := newTestScanner(st, newSwitchPub(), testutil.NewClock(), loopOpts)
	in := make(chan settled, 3)
	for i := range 3 {
		id := "m" + strconv.Itoa(i)
		items := []claimed{{Claimed: store.Claimed{ID: id, Token: "1.5", Data: []byte("payload")}}}
		s.budget.take(bytesOf(items))
		kept := int64(len(items)) * envelopeOverhead
		s.budget.published(bytesOf(items), kept)
		in <- settled{byShard: map[int][]store.Settle{0: {{ID: id, Token: "1.5", Outcome: store.Delivered}}}, held: kept}
	}
	close(in)
	s.ackStage(context.Background(), in)
	if st.calls != 1 {
		t.Fatalf("%d acks, want the three queued batches merged into one", st.calls)
	}
	if claims, settles := s.HeldBytes(); claims != 0 || settles != 0 {
		t.Errorf("held after every settle was written: claims %d, settles %d; want 0", claims, settles)
	}
}

// Every byte a claim takes is given back once its envelopes are published
// and their settles written, however the batches were merged on the way:
// several claims made while the acks were held, then nothing due.
func TestBudgetBackToZeroAfterWork(t *testing.T) {
	t.Parallel()
	opt := loopOpts
	opt.IdleInterval = time.Hour
	opt.ClaimBytes = 1 << 20
	const claims = 3
	var n atomic.Int32
	st := newClaimStore(1, func([]int) ([]store.ClaimResult, error) {
		if n.Add(1) > claims {
			return []store.ClaimResult{result(0, 3_000_000_000, 0)}, nil
		}
		return []store.ClaimResult{result(0, 3_000_000_000, opt.ClaimBatch)}, nil
	})
	st.ackGate = make(chan struct{})
	pub := newSwitchPub()
	s := newTestScanner(st, pub, testutil.NewClock(), opt)
	run(t, s)
	for range claims + 1 {
		st.nextClaim(t)
	}
	eventually(t, "every claimed envelope published", func() bool {
		return pub.sent.Load() == int64(claims*opt.ClaimBatch)
	})
	close(st.ackGate)
	eventually(t, "the claims' and the settles' bytes back to 0", func() bool {
		claims, settles := s.HeldBytes()
		return claims == 0 && settles == 0
	})
}
