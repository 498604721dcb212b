package delivery

import (
	"context"
	"errors"
	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats-server/v2/server"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/recur"
	"github.com/delayd/delayd/internal/scanner"
	"github.com/delayd/delayd/internal/testutil"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestDeliveryMsgCopiesHeaders: the JetStream client sets Nats-Msg-Id on
// the message it publishes; that must not reach the envelope, from which
// the dead-letter copy is built.
func TestDeliveryMsgCopiesHeaders(t *testing.T) {
	t.Parallel()
	d := envelope.Delivery{ID: "a", Due: time.UnixMilli(1000), Attempt: 1,
		Envelope: envelope.Envelope{Target: "t", Header: map[string][]string{"Traceparent": {"00-1"}}}}
	m := deliveryMsg(d)
	m.Header.Set("Nats-Msg-Id", msgID(d))
	if len(d.Header) != 1 || m.Header.Get("Traceparent") != "00-1" || m.Header.Get(envelope.HeaderID) != "a" {
		t.Fatalf("envelope headers %v, message headers %v", d.Header, m.Header)
	}
}

// Size adds up exactly what nats.go counts for the message
// deliveryMsg builds (plus JetStream's Nats-Msg-Id), without building it.
func TestDeliverySizeMatchesTheMessage(t *testing.T) {
	t.Parallel()
	built := func(e envelope.Envelope, id string, js bool) int {
		d := envelope.Delivery{ID: id, Due: envelope.MaxDue.Add(-time.Millisecond), Attempt: longestAttempt, Envelope: e}
		if e.Series != nil {
			d.Occurrence = longestOccurrence
		}
		m := deliveryMsg(d)
		if js {
			m.Header[jetstream.MsgIDHeader] = []string{msgID(d)}
		}
		return m.Size() - len(m.Subject)
	}
	for _, e := range []envelope.Envelope{
		{Target: "a.b"},
		{Target: "a.b", Payload: make([]byte, 1000)},
		{Target: "a.b", Header: map[string][]string{"traceparent": {"00-abc-01"}, "X-Multi": {"1", " two ", ""}}},
		{Target: "a.b", Header: map[string][]string{envelope.HeaderID: {"forged"}, "Nats-Msg-Id": {"x"}, "nats-msg-id": {"y"}}},
		{Target: "a.b", Series: &recur.Rule{Every: time.Second}},
	} {
		for _, js := range []bool{false, true} {
			for _, id := range []string{"order-42", " spaced id ", "\tlead", "trail\t", "ünï"} {
				if got, want := Size(e, id, js), built(e, id, js); got != want {
					t.Errorf("%v js=%v id %q: computed %d, the message is %d", e.Header, js, id, got, want)
				}
			}
		}
	}
}

// BenchmarkPublish measures the delivery path per envelope: building the
// message (the headers copied, delayd's added) and publishing it over core
// NATS to an in-process server with one subscriber, 256 per flush as a busy
// scanner batch; -benchmem gives the allocations per delivery. Variants:
// interest_check (the default: a reply subject per delivery, the statuses
// read after the flush), fire_and_forget (a plain publish, the delivery
// path before the check), and no_subscriber (the check, every delivery
// answered by a no-responders status). With a stream in the account (on
// other subjects): stream_known_targets (every target probed once, then
// known uncaptured) and stream_new_targets (every delivery to a target
// never seen: each batch waits answerWindow for a stream's answer, the
// worst case of the probe).
func BenchmarkPublish(b *testing.B) {
	for _, bc := range []struct {
		name       string
		opt        PublisherOptions
		subscriber bool
		stream     bool
		newTargets bool
	}{
		{"interest_check", PublisherOptions{}, true, false, false},
		{"fire_and_forget", PublisherOptions{FireAndForget: []string{"orders.>"}}, true, false, false},
		{"no_subscriber", PublisherOptions{}, false, false, false},
		{"stream_known_targets", PublisherOptions{}, true, true, false},
		{"stream_new_targets", PublisherOptions{}, true, true, true},
	} {
		b.Run(bc.name, func(b *testing.B) { benchPublish(b, bc.opt, bc.subscriber, bc.stream, bc.newTargets) })
	}
}

func benchPublish(b *testing.B, opt PublisherOptions, subscriber, stream, newTargets bool) {
	n := testutil.StartNATS(b)
	nc, err := nats.Connect(n.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	if subscriber {
		consumer, err := nats.Connect(n.URL())
		if err != nil {
			b.Fatal(err)
		}
		defer consumer.Close()
		sub, err := consumer.Subscribe("orders.>", func(*nats.Msg) {})
		if err != nil {
			b.Fatal(err)
		}
		_ = sub.SetPendingLimits(-1, -1)
		if err := consumer.Flush(); err != nil {
			b.Fatal(err)
		}
	}
	if stream {
		js, err := jetstream.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"other.>"}}); err != nil {
			b.Fatal(err)
		}
	}
	p, err := NewPublisher(nc, bridge.NewRefusals(), opt)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	proven(b, p)
	ds := make([]envelope.Delivery, 256)
	for i := range ds {
		ds[i] = envelope.Delivery{ID: "order-" + strconv.Itoa(i), Due: time.UnixMilli(1_800_000_000_000), Attempt: 1,
			Envelope: envelope.Envelope{Target: "orders.cancel", Header: map[string][]string{"Traceparent": {"00-abc-def-01"}},
				Payload: make([]byte, 128)}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += len(ds) {
		if newTargets {
			for j := range ds {
				ds[j].Target = "orders.cancel." + strconv.Itoa(i+j)
			}
		}
		for _, err := range p.Publish(ctx, ds) {
			if err != nil && (subscriber || !errors.Is(err, scanner.ErrNoInterest)) {
				b.Fatal(err)
			}
		}
	}
}

// TestConcurrentBatchesKeepTheirRefusals: the scanner publishes several
// batches at once. A refusal caused by one batch (a target delayd's NATS
// user may not publish to) must fail that batch's delivery only, not the
// deliveries of a batch sent alongside (found by review: 9,600 of 10,000
// allowed deliveries failed as "could not be attributed").
func TestConcurrentBatchesKeepTheirRefusals(t *testing.T) {
	t.Parallel()
	n := testutil.StartNATS(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: "d", Password: "p", Permissions: &server.Permissions{
			// $JS.API.INFO: a way to prove its inbox (see inboxCheck).
			Publish: &server.SubjectPermission{Allow: []string{"orders.>", "$JS.API.INFO"}}}}}
	})
	ref := bridge.NewRefusals()
	nc, err := bridge.Connect(n.URL(), "t", bridge.Auth{User: "d", Password: "p"}, hclog.NewNullLogger(), nil, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	p, err := NewPublisher(nc, ref, PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	proven(t, p)
	// Someone listens, so the allowed deliveries reach a subscriber.
	consumer, err := nats.Connect(n.URL(), nats.UserInfo("d", "p"))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	if _, err := consumer.Subscribe("orders.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := consumer.Flush(); err != nil {
		t.Fatal(err)
	}
	batch := func(target string, k int) []envelope.Delivery {
		ds := make([]envelope.Delivery, k)
		for i := range ds {
			ds[i] = envelope.Delivery{ID: "x", Due: time.UnixMilli(1_800_000_000_000), Attempt: 1,
				Envelope: envelope.Envelope{Target: target, Payload: []byte("p")}}
		}
		return ds
	}
	for round := range 50 {
		// The user may not list the streams either: the publisher's own
		// request, refused while the batches publish, is none of theirs.
		p.streams.expire()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var wg sync.WaitGroup
		var refused, allowed []error
		wg.Add(2)
		go func() { defer wg.Done(); refused = p.Publish(ctx, batch("secret.x", 1)) }()
		go func() { defer wg.Done(); allowed = p.Publish(ctx, batch("orders.ok", 20)) }()
		wg.Wait()
		cancel()
		if refused[0] == nil {
			t.Fatalf("round %d: the refused delivery counted as delivered", round)
		}
		for _, err := range allowed {
			if err != nil {
				t.Fatalf("round %d: an allowed delivery failed: %v", round, err)
			}
		}
	}
}
