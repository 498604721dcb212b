package bridge

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/envelope"
)

// ErrNotConnected is returned for deliveries attempted while NATS is down:
// nats.go would buffer them, and a buffered publish is not a delivery.
var ErrNotConnected = errors.New("bridge: NATS not connected")

// Publisher delivers due envelopes over core NATS.
type Publisher struct {
	nc *nats.Conn
}

// NewPublisher returns a publisher on nc.
func NewPublisher(nc *nats.Conn) *Publisher { return &Publisher{nc: nc} }

// Publish sends every delivery, then proves the server took them with one
// flush round trip: the PONG comes back only after the server processed
// everything sent before the PING. Each delivery gets its own error.
func (p *Publisher) Publish(ctx context.Context, ds []envelope.Delivery) []error {
	errs := make([]error, len(ds))
	if !p.nc.IsConnected() {
		for i := range errs {
			errs[i] = ErrNotConnected
		}
		return errs
	}
	sent := 0
	for i, d := range ds {
		errs[i] = p.nc.PublishMsg(DeliveryMsg(d))
		if errs[i] == nil {
			sent++
		}
	}
	if sent == 0 {
		return errs
	}
	if err := p.nc.FlushWithContext(ctx); err != nil {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
	}
	return errs
}

// DeliveryMsg builds the delivered message: the payload unchanged, the
// publisher's headers minus the control ones (already removed at intake),
// plus the delivery headers.
func DeliveryMsg(d envelope.Delivery) *nats.Msg {
	h := nats.Header(d.Header)
	if h == nil {
		h = nats.Header{}
	}
	h[envelope.HeaderID] = []string{d.ID}
	h[envelope.HeaderDue] = []string{d.Due.UTC().Format(time.RFC3339Nano)}
	h[envelope.HeaderAttempt] = []string{strconv.Itoa(d.Attempt)}
	return &nats.Msg{Subject: d.Target, Data: d.Payload, Header: h}
}
