package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/envelope"
)

// The JetStream side of `delayd bench`: publishing into a stream with a
// window of unacknowledged publishes, throwaway streams (the baseline
// nobody consumes, and one with ADR-51 message schedules), and watching a
// stream's deliveries.

// outgoing is one message a bench publishes.
type outgoing struct {
	Subject string
	Header  map[string][]string
	Data    []byte
}

// stallWait is how long publishAsync waits for room in its window, and
// ackWait how long for each PubAck.
const (
	stallWait = 10 * time.Second
	ackWait   = 30 * time.Second
)

// publishAsync publishes n messages into JetStream with at most window
// PubAcks outstanding, and returns the time until the last PubAck, how
// many publishes failed and the first failure. counter, if not nil, counts
// PubAcks.
func (c *conn) publishAsync(ctx context.Context, n, window int, msg func(i int) outgoing, counter *atomic.Int64) (took time.Duration, failed int, first error, err error) {
	// A PubAck that never comes (a subject nobody's stream captures
	// answered by a plain subscriber, a server gone) fails its publish
	// after ackWait instead of holding the bench forever.
	js, err := jetstream.New(c.nc, jetstream.WithPublishAsyncMaxPending(window), jetstream.WithPublishAsyncTimeout(ackWait))
	if err != nil {
		return 0, 0, nil, err
	}
	var failures atomic.Int64
	// A pointer, not an atomic.Value: errors of different types would
	// make Value's CompareAndSwap panic.
	var firstErr atomic.Pointer[error]
	start := time.Now()
	futures := make(chan jetstream.PubAckFuture, window)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				failures.Add(1)
				firstErr.CompareAndSwap(nil, &err)
			case <-ctx.Done():
				// Interrupted: what is still unacknowledged counts as
				// failed, at once.
				failures.Add(1)
			}
			if counter != nil {
				counter.Add(1)
			}
		}
	}()
	sent := 0
	for i := 0; i < n && ctx.Err() == nil; i++ {
		o := msg(i)
		// A full window waits for PubAcks up to stallWait, not nats.go's
		// 200 ms: on a loaded machine a stall that short failed a publish
		// that was never sent, and the bench counted it as refused.
		f, err := js.PublishMsgAsync(&nats.Msg{Subject: o.Subject, Header: o.Header, Data: o.Data}, jetstream.WithStallWait(stallWait))
		if err != nil {
			failures.Add(1)
			firstErr.CompareAndSwap(nil, &err)
			continue
		}
		sent++
		futures <- f
	}
	close(futures)
	<-done
	took = time.Since(start)
	if p := firstErr.Load(); p != nil {
		first = *p
	}
	if int(failures.Load()) == n {
		return took, n, first, fmt.Errorf("bench: every publish failed, first: %v", first)
	}
	return took, int(failures.Load()), first, ctx.Err()
}

// hasSchedules reports whether the server c is connected to runs message
// schedules (ADR-51: nats-server 2.12 or newer, with JetStream).
func (c *conn) hasSchedules(ctx context.Context) bool {
	var major, minor int
	if _, err := fmt.Sscanf(c.nc.ConnectedServerVersion(), "%d.%d", &major, &minor); err != nil ||
		major < 2 || major == 2 && minor < 12 {
		return false
	}
	js, err := jetstream.New(c.nc)
	if err != nil {
		return false
	}
	_, err = js.AccountInfo(ctx)
	return err == nil
}

// publishSync publishes one message into JetStream and waits for its
// PubAck.
func (c *conn) publishSync(ctx context.Context, o outgoing) error {
	js, err := jetstream.New(c.nc)
	if err != nil {
		return err
	}
	_, err = js.PublishMsg(ctx, &nats.Msg{Subject: o.Subject, Header: o.Header, Data: o.Data})
	return err
}

// benchStream creates a throwaway file-backed stream on subjects (work
// queue retention, like the intake stream), with ADR-51 message schedules
// allowed when schedules is set, and returns a function that deletes it.
func (c *conn) benchStream(ctx context.Context, name string, subjects []string, schedules bool) (func(), error) {
	js, err := jetstream.New(c.nc)
	if err != nil {
		return nil, err
	}
	cfg := jetstream.StreamConfig{Name: name, Subjects: subjects, Storage: jetstream.FileStorage,
		Retention: jetstream.WorkQueuePolicy, AllowMsgSchedules: schedules}
	if schedules {
		// A schedule's target must be a subject of its own stream, which a
		// consumer then reads: limits retention, as ADR-51 expects.
		cfg.Retention = jetstream.LimitsPolicy
	}
	_ = js.DeleteStream(ctx, name) // left over from an interrupted run
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		return nil, fmt.Errorf("bench: create stream %s: %w", name, err)
	}
	return func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(dctx, name)
	}, nil
}

// watchStream calls fn for every message of stream on filter, read by an
// ordered consumer from now on, until stop is called. The due time is the
// header due carries (RFC 3339).
func (c *conn) watchStream(ctx context.Context, stream, filter, idHeader, dueHeader string, fn func(delivered)) (stop func(), err error) {
	js, err := jetstream.New(c.nc)
	if err != nil {
		return nil, err
	}
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter},
		DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return nil, fmt.Errorf("bench: consumer on %s: %w", stream, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		now := time.Now()
		due, _ := time.Parse(time.RFC3339Nano, m.Headers().Get(dueHeader))
		fn(delivered{ID: m.Headers().Get(idHeader), Due: due, Data: m.Data(), Received: now})
	}, jetstream.PullMaxMessages(4096))
	if err != nil {
		return nil, err
	}
	return cc.Stop, nil
}

// scheduleHeaders are the ADR-51 headers of a JetStream message schedule
// firing once at at and landing on target.
func scheduleHeaders(at time.Time, target string) map[string][]string {
	return map[string][]string{
		"Nats-Schedule":        {"@at " + at.UTC().Format(time.RFC3339Nano)},
		"Nats-Schedule-Target": {target},
	}
}

// intakeHeaders are the headers of a delayd envelope for the stream intake.
func intakeHeaders(target string, at time.Time, id string) map[string][]string {
	return map[string][]string{
		envelope.HeaderTarget: {target},
		envelope.HeaderAt:     {at.UTC().Format(time.RFC3339Nano)},
		envelope.HeaderID:     {id},
	}
}

// pendingTotal is pending plus in flight, from the admin stats endpoint.
func (c *conn) pendingTotal(ctx context.Context) (int64, error) {
	s, err := c.delayd.Stats(ctx)
	if err != nil {
		return 0, err
	}
	return s.Pending + s.Inflight, nil
}

// waitStream waits until the durable consumer name of stream name exists:
// a delayd has set its stream intake up.
func (c *conn) waitStream(ctx context.Context, name string) error {
	js, err := jetstream.New(c.nc)
	if err != nil {
		return err
	}
	for {
		_, err := js.Consumer(ctx, name, name)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no stream intake %s: %w", name, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// deleteStream removes stream name: a bench child's own intake stream,
// so a bench against a real NATS leaves nothing behind.
func (c *conn) deleteStream(ctx context.Context, name string) error {
	js, err := jetstream.New(c.nc)
	if err != nil {
		return err
	}
	return js.DeleteStream(ctx, name)
}
