package scanner

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// Ready must fail with a reason while this daemon cannot renew its shard
// leases: due envelopes would wait for nobody, yet probes said ready.
func TestOwnershipReadyFollowsLeases(t *testing.T) {
	r := testutil.StartRedis(t)
	st := store.New(store.NewClient(store.Options{Addrs: []string{r.Addr}}), "t", 4)
	defer st.Close()
	// As a daemon does before its first round: the scripts loaded, so a
	// round's third of the TTL is not spent reloading them under -race.
	if err := st.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	sc := New(st, &linkPub{}, nil, Options{Shared: true, IdleInterval: time.Second}, hclog.NewNullLogger())
	const ttl = 300 * time.Millisecond
	own := NewOwnership(st, sc, "a", ttl, hclog.NewNullLogger())
	ctx := context.Background()
	if err := own.Ready(ctx); err == nil {
		t.Fatal("ready before any ownership round")
	}
	own.round(ctx)
	if err := own.Ready(ctx); err != nil {
		t.Fatalf("after a good round: %v", err)
	}
	if n := len(sc.Owned()); n != 4 {
		t.Fatalf("a lone daemon owns %d of 4 shards", n)
	}
	r.Kill()
	own.round(ctx)
	time.Sleep(ttl + 50*time.Millisecond)
	own.round(ctx)
	err := own.Ready(ctx)
	if err == nil || !strings.Contains(err.Error(), "not renewed") {
		t.Fatalf("Redis gone for longer than the lease: want not ready, got %v", err)
	}
	r.Start()
	own.round(ctx)
	if err := own.Ready(ctx); err != nil {
		t.Fatalf("after Redis came back: %v", err)
	}
}

// linkPub is a Publisher whose connection the test cuts: it publishes
// nothing.
type linkPub struct {
	down atomic.Bool
	why  error // Down's reason while down
}

func (p *linkPub) Publish(_ context.Context, ds []envelope.Delivery) []error {
	return make([]error, len(ds))
}
func (p *linkPub) Connected() bool { return !p.down.Load() }
func (p *linkPub) Down() error {
	if p.down.Load() {
		return p.why
	}
	return nil
}

// A daemon that reaches Redis but not NATS gives its shards up and leaves
// the member set, so a daemon that can deliver takes them; it says why in
// Ready, and rejoins once connected. A single round without NATS (a
// reconnect) moves nothing.
func TestOwnershipStandsDownWithoutNATS(t *testing.T) {
	r := testutil.StartRedis(t)
	st := store.New(store.NewClient(store.Options{Addrs: []string{r.Addr}}), "t", 8)
	defer st.Close()
	const ttl = 3 * time.Second
	pa, pb := &linkPub{}, &linkPub{}
	sa := New(st, pa, nil, Options{Shared: true, IdleInterval: time.Second}, hclog.NewNullLogger())
	sb := New(st, pb, nil, Options{Shared: true, IdleInterval: time.Second}, hclog.NewNullLogger())
	a := NewOwnership(st, sa, "a", ttl, hclog.NewNullLogger())
	b := NewOwnership(st, sb, "b", ttl, hclog.NewNullLogger())
	ctx := context.Background()
	rounds := func() { a.round(ctx); b.round(ctx); a.round(ctx); b.round(ctx) }
	rounds()
	if na, nb := len(sa.Owned()), len(sb.Owned()); na == 0 || nb == 0 || na+nb != 8 {
		t.Fatalf("two connected daemons own %d and %d of 8 shards", na, nb)
	}
	pa.down.Store(true)
	a.round(ctx)
	if len(sa.Owned()) == 0 {
		t.Fatal("one round without NATS (a reconnect) gave the shards up")
	}
	a.round(ctx)
	b.round(ctx)
	if na, nb := len(sa.Owned()), len(sb.Owned()); na != 0 || nb != 8 {
		t.Fatalf("without NATS a still owns %d shards, b %d of 8", na, nb)
	}
	if err := a.Ready(ctx); err == nil || !strings.Contains(err.Error(), "NATS") {
		t.Fatalf("Ready without NATS: %v", err)
	}
	if err := b.Ready(ctx); err != nil {
		t.Fatalf("the connected daemon: %v", err)
	}
	pa.down.Store(false)
	rounds()
	if na, nb := len(sa.Owned()), len(sb.Owned()); na == 0 || na+nb != 8 {
		t.Fatalf("after NATS came back a owns %d, b %d of 8", na, nb)
	}
	if err := a.Ready(ctx); err != nil {
		t.Fatalf("Ready after NATS came back: %v", err)
	}
}

// A daemon that cannot deliver from its start (its delivery inbox not
// proven, NATS not reachable) takes no shard, not even for the one round a
// reconnect is granted, and says why in Ready; once it can, it takes its
// share.
func TestOwnershipTakesNothingBeforeItCanDeliver(t *testing.T) {
	r := testutil.StartRedis(t)
	st := store.New(store.NewClient(store.Options{Addrs: []string{r.Addr}}), "t", 8)
	defer st.Close()
	const ttl = 3 * time.Second
	pa, pb := &linkPub{why: errors.New("cannot receive on its inbox: Permissions Violation for Subscription")}, &linkPub{}
	pa.down.Store(true)
	sa := New(st, pa, nil, Options{Shared: true, IdleInterval: time.Second}, hclog.NewNullLogger())
	sb := New(st, pb, nil, Options{Shared: true, IdleInterval: time.Second}, hclog.NewNullLogger())
	a := NewOwnership(st, sa, "a", ttl, hclog.NewNullLogger())
	b := NewOwnership(st, sb, "b", ttl, hclog.NewNullLogger())
	ctx := context.Background()
	a.round(ctx)
	if n := len(sa.Owned()); n != 0 {
		t.Fatalf("a daemon that cannot deliver took %d shards at its first round", n)
	}
	b.round(ctx)
	b.round(ctx)
	if n := len(sb.Owned()); n != 8 {
		t.Fatalf("the daemon that can deliver owns %d of 8 shards", n)
	}
	if err := a.Ready(ctx); err == nil || !strings.Contains(err.Error(), "Permissions Violation") {
		t.Fatalf("Ready of the daemon that cannot deliver: %v", err)
	}
	pa.down.Store(false)
	a.round(ctx)
	b.round(ctx)
	a.round(ctx)
	if na, nb := len(sa.Owned()), len(sb.Owned()); na == 0 || na+nb != 8 {
		t.Fatalf("once it can deliver a owns %d, b %d of 8", na, nb)
	}
}

// A daemon that has not yet been able to deliver since it started (its
// inbox self-check still on its first probe) waits for it silently: every
// healthy start logged "cannot deliver: giving up the shards", cleared a
// second later. Once it joined, losing NATS is a warning as before.
func TestStartWaitsForDeliverySilently(t *testing.T) {
	r := testutil.StartRedis(t)
	st := store.New(store.NewClient(store.Options{Addrs: []string{r.Addr}}), "t", 4)
	defer st.Close()
	if err := st.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	pub := newSwitchPub()
	pub.down.Store(true)
	var out testutil.Buffer
	log := hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Info})
	sc := New(st, pub, nil, Options{Shared: true, IdleInterval: time.Second}, log)
	own := NewOwnership(st, sc, "a", time.Second, log)
	ctx := context.Background()
	own.round(ctx)
	own.round(ctx)
	if err := own.Ready(ctx); err == nil {
		t.Fatal("ready before it can deliver")
	}
	pub.down.Store(false)
	own.round(ctx)
	if s := out.String(); strings.Contains(s, "[WARN]") || strings.Contains(s, "again") {
		t.Fatalf("a start that waited for its first delivery proof logged:\n%s", s)
	}
	if n := len(sc.Owned()); n != 4 {
		t.Fatalf("owns %d of 4 shards once it can deliver", n)
	}
	pub.down.Store(true)
	own.round(ctx)
	own.round(ctx)
	if s := out.String(); !strings.Contains(s, "[WARN]") || !strings.Contains(s, "giving up the shards") {
		t.Fatalf("NATS lost after the start: no warning:\n%s", s)
	}
}
