package bench

import (
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/envelope"
)

// conn is one NATS connection of the bench, as any client of delayd has
// one: requests to delayd go through the public client, and the rest
// (watching deliveries, an echo responder, JetStream publishing and
// streams) through nats.go. Only the header names come from envelope.
type conn struct {
	nc      *nats.Conn
	subject string
	delayd  *client.Client
}

// newConn returns a conn over nc, for the delayd at the subject prefix.
func newConn(nc *nats.Conn, subject string) *conn {
	return &conn{nc: nc, subject: subject, delayd: client.New(nc, client.Prefix(subject))}
}

// withSubject returns a conn for the same connection and another service
// subject prefix.
func (c *conn) withSubject(subject string) *conn { return newConn(c.nc, subject) }

// delivered is a delivery as a watcher on the target sees it.
type delivered struct {
	ID       string
	Due      time.Time
	Attempt  int
	Data     []byte
	Received time.Time
}

// watch calls fn for every delivery on subject (which may be a pattern)
// until stop is called. fn runs on one goroutine and must be quick.
func (c *conn) watch(subject string, fn func(delivered)) (stop func(), err error) {
	return c.subscribe(subject, func(m *nats.Msg) {
		now := time.Now()
		due, _ := time.Parse(time.RFC3339Nano, m.Header.Get(envelope.HeaderDue))
		attempt, _ := strconv.Atoi(m.Header.Get(envelope.HeaderAttempt))
		fn(delivered{ID: m.Header.Get(envelope.HeaderID), Due: due, Attempt: attempt, Data: m.Data, Received: now})
	})
}

// echo answers every request on subject at once with an empty JSON object.
// It is the trivial responder that bounds what request/reply can do on
// this machine, the baseline delayd's intake is compared to.
func (c *conn) echo(subject string) (stop func(), err error) {
	return c.subscribe(subject, func(m *nats.Msg) { _ = m.Respond([]byte("{}")) })
}

// subscribe subscribes without pending limits (a bench that falls behind
// must not drop messages: that would count as loss) and waits until the
// server has the interest.
func (c *conn) subscribe(subject string, cb nats.MsgHandler) (stop func(), err error) {
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
