package bridge

import (
	"testing"
	"time"

	"github.com/delayd/delayd/internal/envelope"
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
