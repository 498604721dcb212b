package scanner

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/flow"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// gatedPub blocks its first publish until release is closed.
type gatedPub struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
	mu      sync.Mutex
	got     []string
}

func (p *gatedPub) Publish(_ context.Context, ds []envelope.Delivery) []error {
	p.once.Do(func() { close(p.entered); <-p.release })
	p.mu.Lock()
	for _, d := range ds {
		p.got = append(p.got, d.ID)
	}
	p.mu.Unlock()
	return make([]error, len(ds))
}
func (p *gatedPub) Connected() bool { return true }

// TestResumeDuringPublishStrandsNothing (found by review): a claim holds a paused
// envelope and an unpaused one. The Gate parks the first (ledger +
// marker); while the second is being published, the operator resumes.
// The resume finds the parked one still inflight, drops it from the
// ledger and removes the marker; then the scanner's Hold settle parks it
// at 1e15+due. Nothing ever releases it: it is never delivered.
func TestResumeDuringPublishStrandsNothing(t *testing.T) {
	t.Parallel()
	r := testutil.StartRedis(t)
	st := store.New(store.NewClient(store.Options{Addrs: []string{r.Addr}}), "scan", 1)
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	if _, err := st.Pause(ctx, "paused.>"); err != nil {
		t.Fatal(err)
	}
	enc := func(target string) []byte {
		return envelope.Encode(envelope.Envelope{Target: target, Payload: []byte("p")})
	}
	if _, errs := st.Schedule(ctx, []store.Item{{ID: "p", Data: enc("paused.x")}, {ID: "f", Data: enc("free.x")}}); errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	gate := flow.NewGate(st, nil, nil, hclog.NewNullLogger())
	if err := gate.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go gate.Run(gctx)
	pub := &gatedPub{entered: make(chan struct{}), release: make(chan struct{})}
	opt := Options{ClaimBatch: 10, Lease: 30 * time.Second, IdleInterval: 20 * time.Millisecond, RetryBackoff: time.Second,
		MaxAttempts: 5, DeadSubject: "delayd.dead", Gate: gate}
	s := New(st, pub, nil, opt, hclog.NewNullLogger())
	run(t, s)
	<-pub.entered // "f" is being published, "p" parked in the ledger
	if _, _, err := st.Resume(ctx, "paused.>"); err != nil {
		t.Fatal(err)
	}
	close(pub.release)
	time.Sleep(3 * time.Second) // a dozen Refreshes, hundreds of claims
	pub.mu.Lock()
	got := append([]string(nil), pub.got...)
	pub.mu.Unlock()
	e, _ := st.Get(ctx, "p")
	rules, _ := st.FlowRules(ctx)
	for _, id := range got {
		if id == "p" {
			return
		}
	}
	t.Fatalf("published %v; p never delivered after the resume: %+v (rules %+v)", got, e, rules)
}
