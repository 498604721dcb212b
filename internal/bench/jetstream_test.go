package bench

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/testutil"
)

// A bench publish whose PubAck never comes (here a plain subscriber takes
// the message and answers nothing) no longer holds PublishAsync once its
// context ends: the unacknowledged publishes count as failed. Before, it
// waited for them forever, and Ctrl-C could not end the bench.
func TestPublishAsyncEndsWithItsContext(t *testing.T) {
	t.Parallel()
	n := testutil.StartNATS(t)
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Subscribe("swallowed.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan struct{})
	var failed int
	go func() {
		defer close(done)
		_, failed, _, _ = newConn(nc, "delayd").publishAsync(ctx, 5, 16, func(int) outgoing { return outgoing{Subject: "swallowed.x"} }, new(atomic.Int64))
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("PublishAsync still waiting for PubAcks 5 s after its context ended")
	}
	if failed != 5 {
		t.Fatalf("%d of 5 unacknowledged publishes counted as failed", failed)
	}
}
