package bridge

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/recur"
	"github.com/delayd/delayd/internal/testutil"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestDeliveryMsgCopiesHeaders: the JetStream client sets Nats-Msg-Id on
// the message it publishes; that must not reach the envelope, from which
// the dead-letter copy is built.
func TestDeliveryMsgCopiesHeaders(t *testing.T) {
	d := envelope.Delivery{ID: "a", Due: time.UnixMilli(1000), Attempt: 1,
		Envelope: envelope.Envelope{Target: "t", Header: map[string][]string{"Traceparent": {"00-1"}}}}
	m := DeliveryMsg(d)
	m.Header.Set("Nats-Msg-Id", MsgID(d))
	if len(d.Header) != 1 || m.Header.Get("Traceparent") != "00-1" || m.Header.Get(envelope.HeaderID) != "a" {
		t.Fatalf("envelope headers %v, message headers %v", d.Header, m.Header)
	}
}

// DeliverySize adds up exactly what nats.go counts for the message
// DeliveryMsg builds (plus JetStream's Nats-Msg-Id), without building it.
func TestDeliverySizeMatchesTheMessage(t *testing.T) {
	built := func(e envelope.Envelope, id string, js bool) int {
		d := envelope.Delivery{ID: id, Due: envelope.MaxDue.Add(-time.Millisecond), Attempt: longestAttempt, Envelope: e}
		if e.Series != nil {
			d.Occurrence = longestOccurrence
		}
		m := DeliveryMsg(d)
		if js {
			m.Header[jetstream.MsgIDHeader] = []string{MsgID(d)}
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
			if got, want := DeliverySize(e, "order-42", js), built(e, "order-42", js); got != want {
				t.Errorf("%v js=%v: computed %d, the message is %d", e.Header, js, got, want)
			}
		}
	}
}

// BenchmarkPublish measures the delivery path per envelope: building the
// message (the headers copied, delayd's added) and publishing it over core
// NATS to an in-process server, 256 per flush as a busy scanner batch;
// -benchmem gives the allocations per delivery.
func BenchmarkPublish(b *testing.B) {
	n := testutil.StartNATS(b)
	nc, err := nats.Connect(n.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	p, err := NewPublisher(nc, NewRefusals(), nil)
	if err != nil {
		b.Fatal(err)
	}
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
		for _, err := range p.Publish(ctx, ds) {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
}
