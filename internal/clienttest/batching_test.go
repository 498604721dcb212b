package clienttest

// The client's Batching against a delayd with settings of its own, which
// the client module's tests (one shared delayd, 8 MiB max_payload) cannot
// choose: here the workspace's client runs in this process.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// batchingDaemon starts a delayd with intake.max_batch maxBatch on a NATS
// server of max_payload 65536, and returns a connection to it.
func batchingDaemon(t *testing.T, maxBatch int) *nats.Conn {
	t.Helper()
	testutil.RedisBinary(t)
	n := testutil.StartNATS(t, func(o *server.Options) { o.MaxPayload = 65536 })
	c := daemontest.Config(n, testutil.StartRedis(t))
	c.Intake.MaxBatch = maxBatch
	daemontest.Start(t, c)
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// scheduleAll makes calls concurrent Schedule calls with ids of idLen
// bytes and fails the test if any is not stored under its id.
func scheduleAll(t *testing.T, c *client.Client, calls, idLen int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for i := 0; i < calls; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id := fmt.Sprintf("%d-", i)
			id += strings.Repeat("x", idLen-len(id))
			s, err := c.Schedule(context.Background(), "orders.batching", []byte("p"), client.Delay(time.Hour), client.ID(id))
			if err != nil || s.ID != id {
				errs <- fmt.Errorf("call %d: %+v %w", i, s, err)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	if len(errs) > 0 {
		t.Errorf("%d of %d calls not stored as when sent alone, e.g. %v", len(errs), calls, <-errs)
	}
}

// With max_payload 65536 and 256-byte ids, the reply to a batch of 100
// could outgrow max_payload, and the daemon refuses such a batch whole
// (413). Batching sizes its batches by that reply too (docs/protocol.md,
// Batches, Limits: 170 bytes plus twice the id per envelope), so no call
// gets ErrTooLarge and no batch is sent that the daemon would refuse for
// it. A payload that fits a request alone but not a batch (base64 adds a
// third) is stored too, as it is without batching.
func TestBatchingKeepsTheReplyUnderMaxPayload(t *testing.T) {
	nc := batchingDaemon(t, 1000)
	// Every batch request, as the daemon gets it: its reply's bound.
	var mu sync.Mutex
	var over []string
	tap, err := nc.Subscribe("delayd.schedule", func(m *nats.Msg) {
		if m.Header.Get("Delayd-Batch") == "" {
			return
		}
		var entries []struct{ Headers map[string]any }
		if err := json.Unmarshal(m.Data, &entries); err != nil {
			t.Errorf("a batch request: %v", err)
			return
		}
		n := len(`{"results":[]}`)
		for _, e := range entries {
			id, _ := e.Headers["Delayd-Id"].(string)
			n += 170 + 2*len(id) + 1
		}
		if n > 65536 {
			mu.Lock()
			over = append(over, fmt.Sprintf("a batch of %d envelopes whose reply could take %d bytes", len(entries), n))
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	c := client.New(nc, client.Batching(1000, client.MaxLinger))
	defer c.Close()
	scheduleAll(t, c, 2048, 256)

	big := make([]byte, 48<<10)
	if s, err := c.Schedule(context.Background(), "orders.batching", big, client.Delay(time.Hour), client.ID("big")); err != nil || s.ID != "big" {
		t.Errorf("a 48 KiB payload: %+v %v, want stored as when sent alone", s, err)
	}
	// Every request was answered, so the tap has them all queued.
	if err := tap.Drain(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(10*time.Second, func() bool { return !tap.IsValid() })
	mu.Lock()
	defer mu.Unlock()
	for _, o := range over {
		t.Errorf("sent %s, over max_payload 65536", o)
	}
}

// A client whose Batching size is over the daemon's intake.max_batch gets
// its batches refused whole (413): it sends them again in parts, and every
// call gets the answer its envelope gets alone.
func TestBatchingOverMaxBatch(t *testing.T) {
	nc := batchingDaemon(t, 10)
	c := client.New(nc, client.Batching(100, client.MaxLinger))
	defer c.Close()
	scheduleAll(t, c, 300, 16)
}
