package scanner

import (
	"context"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/flow"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// holdGate rules the targets of ruled; Admit waits for open, then holds
// each one until 5000 ms, except "go.*" ones, which go.
type holdGate struct {
	open  chan struct{}
	asked [][]string
}

func (g *holdGate) Ruled(target string) bool { return target != "free.x" }

// Resumed: free.x was paused until resumedAt.
func (g *holdGate) Resumed(d envelope.Delivery) time.Time {
	if d.Target == "free.x" {
		return resumedAt
	}
	return time.Time{}
}

var resumedAt = time.UnixMilli(5000)

func (g *holdGate) Admit(_ context.Context, ds []envelope.Delivery) []flow.Decision {
	<-g.open
	var ids []string
	out := make([]flow.Decision, len(ds))
	for i, d := range ds {
		ids = append(ids, d.ID)
		if d.Target != "go.x" {
			out[i].HoldUntilMs = 5000
		}
	}
	g.asked = append(g.asked, ids)
	return out
}

// TestGateHoldsOnlyWhatItRules: a batch's unruled deliveries go out before
// flow control decides on the others (its Redis round trip); a held one is
// settled Hold, not sent and not counted; one the gate lets go is sent.
func TestGateHoldsOnlyWhatItRules(t *testing.T) {
	t.Parallel()
	clock := testutil.NewClock()
	pub := &recPub{}
	g := &holdGate{open: make(chan struct{})}
	opt := outcomeOpts
	opt.Gate = g
	s := newTestScanner(&claimStore{shards: 1}, pub, clock, opt)
	enc := func(target string) []byte {
		return envelope.Encode(envelope.Envelope{Target: target, Payload: []byte("p")})
	}
	items := []claimed{
		{shard: 0, at: clock.Now(), Claimed: store.Claimed{ID: "held", DueMs: 1, Attempt: 1, Data: enc("limited.x"), Token: "1.1"}},
		{shard: 0, at: clock.Now(), Claimed: store.Claimed{ID: "free", DueMs: 1, Attempt: 1, Data: enc("free.x"), Token: "1.1"}},
		{shard: 0, at: clock.Now(), Claimed: store.Claimed{ID: "goes", DueMs: 1, Attempt: 1, Data: enc("go.x"), Token: "1.1"}},
	}
	done := make(chan map[int][]store.Settle)
	go func() { done <- s.publish(context.Background(), items) }()
	testutil.Wait(t, 5*time.Second, "the unruled delivery is published while the gate decides", func() bool {
		return pub.count() == 1
	})
	close(g.open)
	settles := <-done
	if len(g.asked) != 1 || len(g.asked[0]) != 2 {
		t.Fatalf("the gate was asked about %v, want held and goes only", g.asked)
	}
	by := map[string]store.Settle{}
	for _, st := range settles[0] {
		by[st.ID] = st
	}
	if st := by["held"]; st.Outcome != store.Hold || st.HoldUntilMs != 5000 || st.Error != "" {
		t.Errorf("held settled %+v, want a hold until 5000", st)
	}
	if by["free"].Outcome != store.Delivered || by["goes"].Outcome != store.Delivered || pub.count() != 2 {
		t.Errorf("settles %+v, published %d; want free and goes delivered", by, pub.count())
	}
	// A target a pause held until just now: its lateness counts from the
	// resume, not from hours of pause.
	pub.mu.Lock()
	defer pub.mu.Unlock()
	if d := pub.got[0][0]; d.ID != "free" || !d.Allowed.Equal(resumedAt) {
		t.Errorf("the first published %s allowed at %v, want free at the resume", d.ID, d.Allowed)
	}
}

// count is how many deliveries were published.
func (p *recPub) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, b := range p.got {
		n += len(b)
	}
	return n
}
