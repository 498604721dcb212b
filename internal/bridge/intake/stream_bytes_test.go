package intake

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
)

// blockedStore holds every Schedule call until release is closed, then
// stores through the real store.
type blockedStore struct {
	StreamStore
	release chan struct{}
}

func (b blockedStore) Schedule(ctx context.Context, items []store.Item) ([]store.Scheduled, []error) {
	<-b.release
	return b.StreamStore.Schedule(context.Background(), items)
}

// A burst of large stream envelopes while Redis is slow stays within
// intake.stream.pull_bytes: the NATS client buffers and the daemon holds at
// most about twice the bound (taken from the stream, not yet acked), not
// the whole pull of 64 messages; once Redis answers, every one is stored.
// The server's max_payload (256 kB) is below the bound, which is never
// raised under it (the largest message a stream may hold).
func TestStreamIntakeBoundsTheBytesItHolds(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t, func(o *server.Options) { o.MaxPayload = 256 << 10 })
	const n, size, bound = 48, 100 << 10, 1 << 20
	bs := blockedStore{StreamStore: e.st, release: make(chan struct{})}
	e.start(bs, func(o *StreamOptions) {
		o.PullBytes = bound
		o.Limits.MaxPayload = 256 << 10
		o.storeTimeout = time.Minute
	})
	js := e.js()
	payload := strings.Repeat("x", size)
	for i := range n {
		publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "t.big", envelope.HeaderID, "big"+strconv.Itoa(i),
			envelope.HeaderDelay, "1h"), payload)
	}
	cons, err := js.Consumer(context.Background(), "DELAYD_INTAKE", "DELAYD_INTAKE")
	if err != nil {
		t.Fatal(err)
	}
	// Taken from the stream and not acked: what the client buffers and the
	// intake holds. It settles once the pulls have stopped at the bound.
	var taken int
	e.eventually("the intake took some", func() bool {
		info, err := cons.Info(context.Background())
		taken = 0
		if err == nil {
			taken = info.NumAckPending
		}
		return taken > 0
	})
	time.Sleep(500 * time.Millisecond) // more would arrive now if nothing bounded them
	info, err := cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if limit := 2*bound/size + 2; info.NumAckPending > limit {
		t.Errorf("%d envelopes of %d kB taken and unacknowledged with pull_bytes %d kB: want at most %d",
			info.NumAckPending, size>>10, bound>>10, limit)
	}
	close(bs.release)
	e.eventually("all stored", func() bool { return e.pending() == n })
	waitHeld(t, "stream intake", e.si.held)
}

// A pull_bytes below one message, with limits.max_payload 0 (follow the
// server), must not stall the consumer: the bound is raised to the
// server's max_payload, so a 100 kB envelope and the small ones behind it
// are all stored. (Before, the bound was raised only to limits.max_payload,
// 0 here, and the server answered every pull "Message Size Exceeds
// MaxBytes" while the head message never came.)
func TestStreamIntakePullBytesBelowOneMessage(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	e.start(e.st, func(o *StreamOptions) {
		o.PullBytes = 4096
		o.Limits.MaxPayload = 0
	})
	js := e.js()
	publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "t.big", envelope.HeaderID, "big", envelope.HeaderDelay, "1h"),
		strings.Repeat("x", 100<<10))
	for i := range 3 {
		publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "t.small", envelope.HeaderID, "small"+strconv.Itoa(i),
			envelope.HeaderDelay, "1h"), "s")
	}
	e.eventually("the large envelope and the small ones behind it stored", func() bool { return e.pending() == 4 })
}

// Shutting down while Redis is slower than the drain wait (storeTimeout)
// and a handler waits for held bytes: the intake stops cleanly once the
// flush returns, and stores what it took (before, Run closed the queue
// after the drain wait and the waking handler panicked sending on it).
func TestStreamIntakeShutdownWithAHandlerWaitingForBytes(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t, func(o *server.Options) { o.MaxPayload = 128 << 10 })
	bs := blockedStore{StreamStore: e.st, release: make(chan struct{})}
	called := make(chan struct{}, 64)
	stop := e.start(calledStore{bs, called}, func(o *StreamOptions) {
		o.PullBytes = 1
		o.Limits.MaxPayload = 128 << 10
		o.storeTimeout = 100 * time.Millisecond
	})
	js := e.js()
	for i := range 8 {
		publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "t.big", envelope.HeaderID, "s"+strconv.Itoa(i),
			envelope.HeaderDelay, "1h"), strings.Repeat("x", 100<<10))
	}
	select {
	case <-called: // a flush is under way, and blocked
	case <-time.After(10 * time.Second):
		t.Fatal("no flush started")
	}
	go func() {
		time.Sleep(500 * time.Millisecond) // past the drain wait
		close(bs.release)
	}()
	stop()
	if n := e.pending(); n < 1 {
		t.Fatalf("%d stored after shutdown, want what was taken", n)
	}
}

// calledStore reports each Schedule call before making it.
type calledStore struct {
	StreamStore
	called chan struct{}
}

func (c calledStore) Schedule(ctx context.Context, items []store.Item) ([]store.Scheduled, []error) {
	select {
	case c.called <- struct{}{}:
	default:
	}
	return c.StreamStore.Schedule(ctx, items)
}

// A durable-intake envelope published before its due time and stored after
// it (no delayd ran meanwhile) counts its lateness from its due time: it
// was accepted (PubAck) in time, so the wait is lateness, not hidden by a
// store time. One published with a Delayd-At already past carries the time
// the stream took it.
func TestStreamIntakeAcceptedAtPublish(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	js := e.js()
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "DELAYD_INTAKE",
		Subjects: []string{"delayd.intake", "delayd.intake.>"}, Retention: jetstream.WorkQueuePolicy}); err != nil {
		t.Fatal(err)
	}
	published := time.Now()
	publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "t.x", envelope.HeaderID, "intime",
		envelope.HeaderAt, published.Add(200*time.Millisecond).UTC().Format(time.RFC3339Nano)), "p")
	publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "t.x", envelope.HeaderID, "past",
		envelope.HeaderAt, published.Add(-time.Hour).UTC().Format(time.RFC3339Nano)), "p")
	time.Sleep(1500 * time.Millisecond) // both past due, and past the skew allowance, before any delayd runs
	e.start(e.st)
	e.eventually("both stored", func() bool { return e.pending() == 2 })
	for id, wantStored := range map[string]bool{"intime": false, "past": true} {
		ent, err := e.st.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		env, err := envelope.Decode(ent.Data)
		if err != nil {
			t.Fatal(err)
		}
		if got := !env.Stored.IsZero(); got != wantStored {
			t.Errorf("%s: Stored %v, want set %v", id, env.Stored, wantStored)
		}
		if wantStored && env.Stored.Sub(published).Abs() > time.Second {
			t.Errorf("%s: Stored %v, want the publish time %v", id, env.Stored, published)
		}
	}
}
