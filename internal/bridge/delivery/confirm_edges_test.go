package delivery

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/testutil"
)

// forgedRefusal is what a consumer publishes on its own delivery's reply
// subject to pass for a stream's refusal.
const forgedRefusal = `{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"},"stream":"%s","seq":0}`

// A consumer that answers its own deliveries with a refusal naming a
// stream the account does not have, after their batch was confirmed,
// teaches delayd nothing: its target is not learned as captured, so later
// deliveries to it (and the other targets of their batches) do not wait
// for a stream answer that never comes. It failed before: "forge.x is
// learned from a stream the account does not list", and the next batch
// waited until its deadline.
func TestForgedLateRefusalTeachesNothing(t *testing.T) {
	t.Parallel()
	// A stream of the user's, on other subjects: new targets are probed.
	n, nc, _, ctx := withStream(t, "REAL", "real.>")
	forger := clientConn(t, n)
	var mu sync.Mutex
	var replies []string
	if _, err := forger.Subscribe("forge.x", func(m *nats.Msg) {
		mu.Lock()
		replies = append(replies, m.Reply)
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	victim := clientConn(t, n)
	if _, err := victim.Subscribe("victim.x", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	_ = forger.Flush()
	_ = victim.Flush()

	p := provenPublisher(t, nc)
	if errs := p.Publish(ctx, deliveries("forge.x")); errs[0] != nil {
		t.Fatalf("first delivery to forge.x: %v", errs[0])
	}
	// The batch is confirmed: now the forged refusal, and the list read
	// it asks for.
	mu.Lock()
	reply := replies[0]
	mu.Unlock()
	before := time.Now()
	if err := forger.Publish(reply, []byte(strings.ReplaceAll(forgedRefusal, "%s", "FAKE"))); err != nil {
		t.Fatal(err)
	}
	_ = forger.Flush()
	waitFor(t, "the list of streams read again after the forged answer", func() bool {
		c := p.streams
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.poked.After(before) && c.running == nil
	})
	if await, _ := p.streams.captured("forge.x"); await {
		t.Fatal("forge.x is learned from a stream the account does not list")
	}
	// Another batch, both targets: nothing waits for the forged stream.
	bctx, bcancel := context.WithTimeout(ctx, 3*time.Second)
	defer bcancel()
	errs := p.Publish(bctx, deliveries("forge.x", "victim.x"))
	if errs[0] != nil || errs[1] != nil || bctx.Err() != nil {
		t.Fatalf("a batch to forge.x and victim.x after the forgery: %v (context %v)", errs, bctx.Err())
	}

	// A refusal naming a stream the account lists is believed: it teaches
	// the target (a subject mapping routes it there), but the wait for its
	// answer is bounded by answerWindow, never the publish deadline, so
	// the forger fails only its own delivery, and the victim's in the
	// same batch is confirmed.
	mu.Lock()
	reply = replies[len(replies)-1]
	mu.Unlock()
	if err := forger.Publish(reply, []byte(strings.ReplaceAll(forgedRefusal, "%s", "REAL"))); err != nil {
		t.Fatal(err)
	}
	_ = forger.Flush()
	waitFor(t, "forge.x learned from REAL's (forged) answer", func() bool { await, _ := p.streams.captured("forge.x"); return await })
	errs = p.Publish(bctx, deliveries("forge.x", "victim.x"))
	if bctx.Err() != nil {
		t.Fatal("a batch with a learned target waited until its deadline")
	}
	if errs[1] != nil {
		t.Errorf("victim.x beside a forger's target: %v", errs[1])
	}
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "did not answer in time") {
		t.Errorf("forge.x, learned from a forged answer, answered by no stream: %v", errs[0])
	}
	if await, _ := p.streams.captured("forge.x"); await {
		t.Error("forge.x still learned after REAL missed its answer")
	}
}

// A stream deleted while deliveries go to the targets it captured answers
// nothing: the delivery that misses its answer has the list read again
// at once, finds the stream gone, and counts by its flush (a core
// subscriber took it), instead of failing and going out again until the
// periodic read: before, each one waited for its deadline and failed
// ("did not answer in time"), 715 copies of 500 ids.
func TestDeletedStreamCostsNoCopy(t *testing.T) {
	t.Parallel()
	n, nc, js, ctx := withStream(t, "GONE", "gone.>")
	sub := clientConn(t, n)
	got, err := sub.SubscribeSync("gone.x")
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.Flush()
	p := provenPublisher(t, nc)
	if errs := p.Publish(ctx, deliveries("gone.x")); errs[0] != nil {
		t.Fatalf("a delivery to gone.x while GONE captures it: %v", errs[0])
	}
	if err := js.DeleteStream(ctx, "GONE"); err != nil {
		t.Fatal(err)
	}
	bctx, bcancel := context.WithTimeout(ctx, 3*time.Second)
	defer bcancel()
	if errs := p.Publish(bctx, deliveries("gone.x")); errs[0] != nil || bctx.Err() != nil {
		t.Fatalf("a delivery to gone.x after GONE was deleted: %v (context %v)", errs[0], bctx.Err())
	}
	for i := range 2 {
		if _, err := got.NextMsg(5 * time.Second); err != nil {
			t.Fatalf("the subscriber got %d of 2 deliveries: %v", i, err)
		}
	}
	if m, err := got.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatalf("a third copy: %s", m.Header.Get(envelope.HeaderID))
	}
}

// On a slow path a batch's flush round trip is waited for outside the
// publisher's send lock: a second batch is written while the first waits
// for its PONG. Before, batches were sent one round trip after the other,
// and lateness on a path of RTT r grew to several r (0.9 s at 200 ms).
// The path is slow downward only (50 ms up, 600 ms down), so the order
// below has 500 ms of margin either way.
func TestSlowPathPipelinesBatches(t *testing.T) {
	t.Parallel()
	n := testutil.StartNATS(t)
	proxy := testutil.StartProxy(t, strings.TrimPrefix(n.URL(), "nats://"))
	nc, err := bridge.Connect("nats://"+proxy.Addr(), "t", bridge.Auth{}, hclog.NewNullLogger(), nil, bridge.NewRefusals(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub := clientConn(t, n)
	arrived := make(chan string, 4)
	if _, err := sub.Subscribe("slow.*", func(m *nats.Msg) { arrived <- m.Subject }); err != nil {
		t.Fatal(err)
	}
	_ = sub.Flush()
	p := provenPublisher(t, nc)
	proxy.Set(testutil.Up, testutil.Fault{Latency: 50 * time.Millisecond})
	proxy.Set(testutil.Down, testutil.Fault{Latency: 600 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first := make(chan []error, 1)
	go func() { first <- p.Publish(ctx, deliveries("slow.a")) }()
	if s := <-arrived; s != "slow.a" {
		t.Fatalf("arrived %s first", s)
	}
	second := make(chan []error, 1)
	go func() { second <- p.Publish(ctx, deliveries("slow.b")) }()
	select {
	case s := <-arrived:
		if s != "slow.b" {
			t.Fatalf("arrived %s second", s)
		}
	case errs := <-first:
		t.Fatalf("the first batch was confirmed (%v) before the second was written: batches wait for each other's round trip", errs)
	}
	for _, c := range []chan []error{first, second} {
		if errs := <-c; errs[0] != nil {
			t.Errorf("a delivery on the slow path: %v", errs[0])
		}
	}
}

// waitFor polls cond until it holds, for at most 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !testutil.Eventually(10*time.Second, cond) {
		t.Fatalf("after 10s: not %s", what)
	}
}

// clientConn is a plain client of n, closed when the test ends.
func clientConn(t *testing.T, n *testutil.NATS) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// provenPublisher is a publisher on nc with default options, its inbox
// proven, closed when the test ends.
func provenPublisher(t *testing.T, nc *nats.Conn) *Publisher {
	t.Helper()
	p, err := NewPublisher(nc, bridge.NewRefusals(), PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	proven(t, p)
	return p
}

// Every delivery of a batch to a target learned from a listed stream that
// then misses its answer fails, not only the first: gone used to forget
// the target on its first call and count the others delivered, unanswered
// ("[did not answer in time, <nil>, <nil>]").
func TestSilentLearnedStreamFailsEveryDelivery(t *testing.T) {
	t.Parallel()
	n, nc, _, ctx := withStream(t, "REAL", "real.>")
	sub := clientConn(t, n)
	if _, err := sub.Subscribe("mapped.x", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	_ = sub.Flush()
	p := provenPublisher(t, nc)
	// As if REAL had answered for mapped.x through a mapping: learned.
	p.streams.heard("mapped.x", stored, "", "REAL", true)
	if await, _ := p.streams.captured("mapped.x"); !await {
		t.Fatal("mapped.x not learned from REAL's answer")
	}
	errs := p.Publish(ctx, deliveries("mapped.x", "mapped.x", "mapped.x"))
	for i, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "did not answer in time") {
			t.Errorf("delivery %d to a learned target whose listed stream did not answer: %v, want failed", i, err)
		}
	}
}

// The list of streams answered by no responders after it named streams
// (a leaf node's link to the JetStream hub down) is a failed read, not an
// account without streams: the streams it named still count, and a missed
// answer is not taken for a deleted stream.
func TestNoRespondersAfterStreamsIsAFailedRead(t *testing.T) {
	t.Parallel()
	_, _, js, ctx := withStream(t, "CAP", "cap.>")
	c := newCaptors(js, bridge.NewRefusals(), hclog.NewNullLogger(), "")
	c.ready(ctx)
	if await, _ := c.captured("cap.x"); !await {
		t.Fatal("cap.x not captured by the listed CAP")
	}
	// JetStream out of reach (the API gets no responders): as if the
	// account's JetStream servers were behind a link that went down.
	core := testutil.StartNATS(t, func(o *server.Options) { o.JetStream = false })
	c.js = jsOf(t, clientConn(t, core))
	c.mu.Lock()
	done := c.refreshLocked()
	c.mu.Unlock()
	<-done
	if await, _ := c.captured("cap.x"); !await {
		t.Error("cap.x no longer awaited after a list read that got no responders")
	}
	if c.gone(ctx, "cap.x") {
		t.Error("a missed answer from CAP taken for a deleted stream after a read that got no responders")
	}
}

// withStream starts a NATS server whose account has the stream name on
// subject, and returns it with the daemon's connection, its JetStream and
// a context of 30 s ended with the test.
func withStream(t *testing.T, name, subject string) (*testutil.NATS, *nats.Conn, jetstream.JetStream, context.Context) {
	t.Helper()
	n := testutil.StartNATS(t)
	nc := daemonConn(t, n)
	js := jsOf(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}}); err != nil {
		t.Fatal(err)
	}
	return n, nc, js, ctx
}
