package delivery

import (
	"context"
	"errors"
	"fmt"
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
	"github.com/delayd/delayd/internal/scanner"
	"github.com/delayd/delayd/internal/testutil"
)

func deliveries(targets ...string) []envelope.Delivery {
	ds := make([]envelope.Delivery, len(targets))
	for i, t := range targets {
		ds[i] = envelope.Delivery{ID: fmt.Sprintf("e%d", i), Due: time.UnixMilli(1_800_000_000_000), Attempt: 1,
			Envelope: envelope.Envelope{Target: t, Payload: []byte("p")}}
	}
	return ds
}

// Within one batch, each delivery the server found no subscriber for (its
// no-responders status) fails with ErrNoInterest, and only those: the
// statuses are attributed by reply subject, in a batch that mixes targets
// with and without subscribers. Subscribers that reply (with a body, or
// an empty message without the status) do not count as no-interest; a
// queue group or a wildcard subscription is interest; a fire-and-forget
// target keeps the plain publish (no reply subject, never retried).
func TestNoInterestAttributedWithinBatch(t *testing.T) {
	t.Parallel()
	n := testutil.StartNATS(t, func(o *server.Options) {
		// delayd's user may subscribe to its own inbox prefix only, as in
		// the permission blocks of docs/security.md.
		o.Users = []*server.User{
			{Username: "d", Password: "p", Permissions: &server.Permissions{
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX_delayd.>"}}}},
			{Username: "c", Password: "p"},
		}
	})
	ref := bridge.NewRefusals()
	nc, err := bridge.Connect(n.URL(), "t", bridge.Auth{User: "d", Password: "p", InboxPrefix: "_INBOX_delayd"}, hclog.NewNullLogger(), nil, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	p, err := NewPublisher(nc, ref, PublisherOptions{FireAndForget: []string{"signal.>"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	proven(t, p)

	consumer, err := nats.Connect(n.URL(), nats.UserInfo("c", "p"))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	var mu sync.Mutex
	replies := map[string]string{} // subject → reply subject seen
	record := func(m *nats.Msg) {
		mu.Lock()
		replies[m.Subject] = m.Reply
		mu.Unlock()
	}
	subs := []struct {
		subject, queue string
		cb             nats.MsgHandler
	}{
		{"has.plain", "", record},
		{"has.reply", "", func(m *nats.Msg) { record(m); _ = m.Respond([]byte("thanks")) }},
		{"has.empty", "", func(m *nats.Msg) { record(m); _ = m.Respond(nil) }},
		{"has.queue", "workers", record},
		{"wild.*", "", record},
		{"signal.heard", "", record},
	}
	for _, s := range subs {
		if _, err := consumer.QueueSubscribe(s.subject, s.queue, s.cb); err != nil {
			t.Fatal(err)
		}
	}
	if err := consumer.Flush(); err != nil {
		t.Fatal(err)
	}

	targets := []string{"has.plain", "none.a", "has.reply", "none.a", "has.empty", "none.b", "has.queue",
		"wild.card", "signal.nobody", "signal.heard", "none.c", "has.plain"}
	want := map[string]bool{"none.a": true, "none.b": true, "none.c": true} // no interest
	for round := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs := p.Publish(ctx, deliveries(targets...))
		cancel()
		for i, err := range errs {
			switch {
			case want[targets[i]] && !errors.Is(err, scanner.ErrNoInterest):
				t.Fatalf("round %d: %s (#%d) had no subscriber, got %v", round, targets[i], i, err)
			case want[targets[i]] && errors.Is(err, scanner.ErrUnreachable):
				t.Fatalf("round %d: %s: a message that reached the server is not unreachable: %v", round, targets[i], err)
			case !want[targets[i]] && err != nil:
				t.Fatalf("round %d: %s (#%d) has a subscriber or is fire-and-forget, got %v", round, targets[i], i, err)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if r := replies["has.plain"]; len(r) < len("_INBOX_delayd.") || r[:len("_INBOX_delayd.")] != "_INBOX_delayd." {
		t.Errorf("a checked delivery's reply subject is %q, want one under nats.inbox_prefix", r)
	}
	if r, ok := replies["signal.heard"]; !ok || r != "" {
		t.Errorf("a fire-and-forget delivery came with reply %q (seen %v), want a plain publish", r, ok)
	}
}

// Batches publish concurrently (the scanner's publish workers): each sees
// exactly its own no-interest statuses, and a subscriber that comes later
// makes the same target succeed.
func TestNoInterestConcurrentBatches(t *testing.T) {
	t.Parallel()
	n := testutil.StartNATS(t)
	nc := daemonConn(t, n)
	p, err := NewPublisher(nc, bridge.NewRefusals(), PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	proven(t, p)
	consumer, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	if _, err := consumer.Subscribe("yes.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	_ = consumer.Flush()
	for round := range 30 {
		var g sync.WaitGroup
		results := make([][]error, 4)
		batches := [][]string{
			{"yes.1", "yes.2", "yes.3"},
			{"no.1", "no.2"},
			{"yes.4", "no.3", "yes.5", "no.4"},
			{"no.5", "yes.6"},
		}
		for i, b := range batches {
			g.Add(1)
			go func() {
				defer g.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				results[i] = p.Publish(ctx, deliveries(b...))
			}()
		}
		g.Wait()
		for i, b := range batches {
			for j, target := range b {
				noInterest := errors.Is(results[i][j], scanner.ErrNoInterest)
				if noInterest != (target[:3] == "no.") || (!noInterest && results[i][j] != nil) {
					t.Fatalf("round %d: %s: %v", round, target, results[i][j])
				}
			}
		}
	}
	// The target gains a subscriber: delivered.
	if _, err := consumer.Subscribe("no.1", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	_ = consumer.Flush()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Publish(ctx, deliveries("no.1"))[0]; err != nil {
		t.Fatalf("a subscriber came: %v", err)
	}
}

// A core target captured by a stream (not listed in targets.jetstream) has
// a subscriber, the stream: delivered, and the PubAcks the stream sends to
// the reply subjects are read and dropped, batch after batch.
func TestNoInterestStreamIsInterest(t *testing.T) {
	t.Parallel()
	n := testutil.StartNATS(t)
	nc := daemonConn(t, n)
	js := jsOf(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "CAPTURED", Subjects: []string{"captured.>"}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPublisher(nc, bridge.NewRefusals(), PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	proven(t, p)
	for round := range 10 {
		for i, err := range p.Publish(ctx, deliveries("captured.a", "nobody.here", "captured.b")) {
			if (i == 1) != errors.Is(err, scanner.ErrNoInterest) || (i != 1 && err != nil) {
				t.Fatalf("round %d, delivery %d: %v", round, i, err)
			}
		}
	}
	// The flush confirms the server took the messages; the stream stores
	// them a moment later (its PubAcks are what tells).
	var msgs uint64
	testutil.Eventually(5*time.Second, func() bool {
		if info, err := s.Info(ctx); err == nil {
			msgs = info.State.Msgs
		}
		return msgs >= 20
	})
	if msgs != 20 {
		t.Fatalf("stream holds %d messages, want 20", msgs)
	}
}

// When whether a core delivery reached a subscriber cannot be known (the
// batch's no-responders statuses were not all read: nats.go dropped some,
// here one more than at the batch's start), no delivery of the batch
// counts as delivered: each fails, as unknown rather than as no interest.
func TestNoInterestUnknownIsNotDelivered(t *testing.T) {
	t.Parallel()
	n := testutil.StartNATS(t)
	nc := daemonConn(t, n)
	p, err := NewPublisher(nc, bridge.NewRefusals(), PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ds := deliveries("a.x", "b.x")
	b, dropped := p.interest.begin(ds, func(int) wait { return noWait })
	errs := make([]error, len(ds))
	p.noInterest(ctx, b, ds, []kind{checkedCore, checkedCore}, errs, dropped+1)
	p.interest.settle(ctx, b, 0, 0)
	for i, err := range errs {
		if err == nil || errors.Is(err, scanner.ErrNoInterest) || !strings.Contains(err.Error(), "unknown") {
			t.Errorf("#%d: got %v, want failed as unknown", i, err)
		}
	}
}

// Ended batches are kept for late answers by count and by deliveries:
// behind a backlog a publish merges thousands of deliveries into one
// batch, and 64 such batches held tens of MB of reply subjects and
// targets (31% of the heap at 100k due/s). The newest is always kept.
func TestEndedBatchesBoundedByDeliveries(t *testing.T) {
	t.Parallel()
	in := &interest{batches: map[string]*batch{}, ended: map[string]*batch{}}
	done := make(chan struct{})
	close(done)
	end := func(token string, n int) {
		b := &batch{token: token, ends: make([]int, n), targets: make([]string, n), verdicts: make([]verdict, n),
			reasons: make([]string, n), await: make([]bool, n), probe: make([]bool, n), allIn: done, listedIn: done}
		in.batches[token] = b
		in.settle(context.Background(), b, 0, 0)
	}
	kept := func(token string) bool { _, ok := in.ended[token]; return ok }
	end("a", endedKeptDeliveries/2+1)
	end("b", endedKeptDeliveries/2+1)
	if kept("a") || !kept("b") {
		t.Fatalf("over %d deliveries: a kept %v, b kept %v; want only b", endedKeptDeliveries, kept("a"), kept("b"))
	}
	end("huge", 3*endedKeptDeliveries)
	if kept("b") || !kept("huge") {
		t.Fatalf("one batch over the bound alone: b kept %v, huge kept %v; want huge only", kept("b"), kept("huge"))
	}
	for i := range 2 * endedKept {
		end(fmt.Sprint(i), 1)
	}
	if len(in.ended) != endedKept || len(in.endedOrder) != endedKept || kept("huge") {
		t.Fatalf("after %d small batches: %d kept (%d in order), huge kept %v; want %d", 2*endedKept, len(in.ended), len(in.endedOrder), kept("huge"), endedKept)
	}
	if in.endedSize != endedKept {
		t.Fatalf("endedSize %d, want %d", in.endedSize, endedKept)
	}
}
