package bridge

import (
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/envelope"
)

// Probe is what `delayd bench` needs beside the public client: watching
// deliveries, an echo responder, and JetStream publishing and streams.
// Requests to delayd go through Delayd, the public client.
type Probe struct {
	nc     *nats.Conn
	Delayd *client.Client
}

// NewProbe returns a probe over nc, for the delayd at the subject prefix.
func NewProbe(nc *nats.Conn, subject string) *Probe {
	return &Probe{nc: nc, Delayd: client.New(nc, client.Prefix(subject))}
}

// Delivered is a delivery as a watcher on the target sees it.
type Delivered struct {
	ID       string
	Due      time.Time
	Attempt  int
	Data     []byte
	Received time.Time
}

// Watch calls fn for every delivery on subject (which may be a pattern)
// until stop is called. fn runs on one goroutine and must be quick.
func (c *Probe) Watch(subject string, fn func(Delivered)) (stop func(), err error) {
	return c.subscribe(subject, func(m *nats.Msg) {
		now := time.Now()
		due, _ := time.Parse(time.RFC3339Nano, m.Header.Get(envelope.HeaderDue))
		attempt, _ := strconv.Atoi(m.Header.Get(envelope.HeaderAttempt))
		fn(Delivered{ID: m.Header.Get(envelope.HeaderID), Due: due, Attempt: attempt, Data: m.Data, Received: now})
	})
}

// Echo answers every request on subject at once with an empty JSON object.
// It is the trivial responder that bounds what request/reply can do on
// this machine, the baseline delayd's intake is compared to.
func (c *Probe) Echo(subject string) (stop func(), err error) {
	return c.subscribe(subject, func(m *nats.Msg) { _ = m.Respond([]byte("{}")) })
}

// subscribe subscribes without pending limits (a bench that falls behind
// must not drop messages: that would count as loss) and waits until the
// server has the interest.
func (c *Probe) subscribe(subject string, cb nats.MsgHandler) (stop func(), err error) {
	sub, err := c.nc.Subscribe(subject, cb)
	if err != nil {
		return nil, err
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := c.nc.Flush(); err != nil {
		return nil, err
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// WithSubject returns a probe for the same connection and another service
// subject prefix.
func (c *Probe) WithSubject(subject string) *Probe { return NewProbe(c.nc, subject) }
