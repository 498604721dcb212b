package bridge

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
)

// blockedStore holds every Schedule call until release is closed, then
// stores through the real store.
type blockedStore struct {
	StreamStore
	release chan struct{}
}

func (b blockedStore) Schedule(ctx context.Context, items []store.Item) ([]int64, []error) {
	<-b.release
	return b.StreamStore.Schedule(context.Background(), items)
}

// A burst of large stream envelopes while Redis is slow stays within
// intake.stream.pull_bytes: the NATS client buffers and the daemon holds at
// most about twice the bound (taken from the stream, not yet acked), not
// the whole pull of 64 messages; once Redis answers, every one is stored.
func TestStreamIntakeBoundsTheBytesItHolds(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	const n, size, bound = 48, 100 << 10, 1 << 20
	bs := blockedStore{StreamStore: e.st, release: make(chan struct{})}
	e.start(bs, func(o *StreamOptions) {
		o.PullBytes = bound
		o.Limits.MaxPayload = 256 << 10
		o.StoreTimeout = time.Minute
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
}
