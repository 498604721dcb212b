package systest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

func TestJetStreamTarget(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Targets.JetStream = []string{"js.>"}
	st := e.Stream("ORDERS", "js.orders.>")
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	ids := daemontest.ScheduleMany(t, nc, 200, 8, "j", func(i int, h nats.Header) {
		h.Set("Delayd-Target", "js.orders.cancel")
		h.Set("Delayd-Delay", "200ms")
	})
	testutil.Eventually(10*time.Second, func() bool { return daemontest.StreamMsgs(t, st) >= uint64(len(ids)) })
	if n := daemontest.StreamMsgs(t, st); n != uint64(len(ids)) {
		t.Fatalf("stream holds %d messages, want %d", n, len(ids))
	}
	m, err := st.GetMsg(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if id := m.Header.Get("Nats-Msg-Id"); !strings.HasPrefix(id, m.Header.Get("Delayd-Id")+"@") {
		t.Errorf("Nats-Msg-Id %q is not <id>@<due>", id)
	}
	if e.Stored(c) != 0 {
		t.Error("envelopes left after PubAck")
	}
}

// TestSlowJetStreamTargetDoesNotStall: a JetStream target whose PubAcks
// come 1.2 s late, with a 4 s lease (2 s to publish, counted from the
// claim). Envelopes due 300 ms apart are claimed in separate batches; had
// each batch to wait for the PubAcks of the one before, the later ones
// would spend their 2 s waiting and fail on every attempt (found by
// review: they ended in the dead set). Each must go out once, attempt 1.
func TestSlowJetStreamTargetDoesNotStall(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Scanner.Lease = 4 * time.Second
	c.Targets.JetStream = []string{"slowjs.>"}
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	var mu sync.Mutex
	got := map[string][]string{} // id → attempts received
	seq := 0
	sub, err := nc.Subscribe("slowjs.x", func(m *nats.Msg) {
		mu.Lock()
		got[m.Header.Get("Delayd-Id")] = append(got[m.Header.Get("Delayd-Id")], m.Header.Get("Delayd-Attempt"))
		seq++
		ack := fmt.Sprintf(`{"stream":"SLOW","seq":%d}`, seq)
		mu.Unlock()
		// A stream that acknowledges, slowly.
		time.AfterFunc(1200*time.Millisecond, func() { _ = m.Respond([]byte(ack)) })
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	start := time.Now().Add(time.Second)
	const n = 6
	for i := range n {
		at := start.Add(time.Duration(i) * 300 * time.Millisecond).UTC().Format(time.RFC3339Nano)
		daemontest.ScheduleOK(t, nc, daemontest.Hdr("Delayd-Target", "slowjs.x", "Delayd-At", at, "Delayd-Id", "slow-"+strconv.Itoa(i)), "x")
	}
	testutil.Eventually(15*time.Second, func() bool { return e.Stored(c) == 0 })
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		id := "slow-" + strconv.Itoa(i)
		if a := got[id]; len(a) != 1 || a[0] != "1" {
			t.Errorf("%s delivered with attempts %v, want once, attempt 1", id, a)
		}
	}
	if left := e.Stored(c); left != 0 {
		t.Errorf("%d envelopes still stored (dead or retrying)", left)
	}
}
