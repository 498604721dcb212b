package intake_test

// Batch requests against a whole daemon on real servers: a NATS client
// that knows only the documented format (JSON, base64 payloads), a real
// Redis with 4 shards.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

type wireEntry struct {
	Headers map[string]string `json:"headers"`
	Payload string            `json:"payload"`
}

type wireResult struct {
	ID        string `json:"id"`
	DeliverAt string `json:"deliver_at"`
	Code      int    `json:"code"`
	Error     string `json:"error"`
}

// sendBatch requests a batch on subject and returns its results, or the
// micro error code of a batch refused whole.
func sendBatch(t *testing.T, nc *nats.Conn, entries []wireEntry) ([]wireResult, string) {
	t.Helper()
	body, err := json.Marshal(entries)
	if err != nil {
		t.Fatal(err)
	}
	m, err := nc.RequestMsg(&nats.Msg{Subject: "delayd.schedule", Header: nats.Header{"Delayd-Batch": {"json"}}, Data: body}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code := m.Header.Get("Nats-Service-Error-Code"); code != "" {
		return nil, code + " " + m.Header.Get("Nats-Service-Error")
	}
	var r struct{ Results []wireResult }
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.Fatalf("reply %q: %v", m.Data, err)
	}
	return r.Results, ""
}

// arrivals counts deliveries by Delayd-Id.
type arrivals struct {
	mu  sync.Mutex
	got map[string]int
}

func watch(t *testing.T, nc *nats.Conn, subject string) *arrivals {
	t.Helper()
	a := &arrivals{got: map[string]int{}}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		a.mu.Lock()
		a.got[m.Header.Get("Delayd-Id")]++
		a.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return a
}

func (a *arrivals) count(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.got[id]
}

// until polls cond, failing after a generous deadline (a hang guard).
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

func pending(t *testing.T, c *client.Client) int64 {
	t.Helper()
	s, err := c.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s.Pending + s.Inflight
}

// A batch over several shards is stored whole but for its bad envelope,
// which alone is refused; every stored one is delivered once. The same
// batch resent after the deliveries (a client that lost the reply) is
// answered from the tombstones with the deliver_at each had, and nothing is
// stored or delivered again. A batch over intake.max_batch is refused as a
// whole, nothing of it stored.
func TestBatchOnADaemon(t *testing.T) {
	t.Parallel()
	n, r := testutil.StartNATS(t), testutil.StartRedis(t)
	c := daemontest.Config(n, r)
	c.Intake.MaxBatch = 50
	daemontest.Start(t, c)
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	dc := client.New(nc)
	got := watch(t, nc, "batch.t")

	const bad = 5
	var entries []wireEntry
	shards := map[int]bool{}
	st := store.New(nil, c.Namespace, c.Shards)
	for i := range 40 {
		id := fmt.Sprintf("b%d", i)
		target := "batch.t"
		if i == bad {
			target = "$SYS.nope"
		} else {
			shards[st.Shard(id)] = true
		}
		entries = append(entries, wireEntry{
			Headers: map[string]string{"Delayd-Target": target, "Delayd-Delay": "50ms", "Delayd-Id": id, "X-Seq": fmt.Sprint(i)},
			Payload: base64.StdEncoding.EncodeToString([]byte(fmt.Sprintf("payload %d", i))),
		})
	}
	if len(shards) < 2 {
		t.Fatalf("the batch's ids fall in %d shard(s); the test wants several", len(shards))
	}
	first, refused := sendBatch(t, nc, entries)
	if refused != "" || len(first) != len(entries) {
		t.Fatalf("batch: %d results, refused %q", len(first), refused)
	}
	for i, res := range first {
		switch {
		case i == bad && res.Code != 403:
			t.Errorf("envelope %d: %+v, want 403", i, res)
		case i != bad && (res.Code != 0 || res.ID != entries[i].Headers["Delayd-Id"] || res.DeliverAt == ""):
			t.Errorf("envelope %d: %+v, want stored", i, res)
		}
	}
	until(t, "every stored envelope arrived", func() bool {
		for i, e := range entries {
			if i != bad && got.count(e.Headers["Delayd-Id"]) == 0 {
				return false
			}
		}
		return true
	})
	until(t, "nothing is pending", func() bool { return pending(t, dc) == 0 })

	again, refused := sendBatch(t, nc, entries)
	if refused != "" || len(again) != len(first) {
		t.Fatalf("resent batch: %d results, refused %q", len(again), refused)
	}
	for i := range first {
		if again[i] != first[i] {
			t.Errorf("envelope %d resent: %+v, want the first answer %+v", i, again[i], first[i])
		}
	}
	if p := pending(t, dc); p != 0 {
		t.Errorf("%d envelopes pending after the resend of a delivered batch, want 0 (answered from tombstones)", p)
	}
	for i, e := range entries {
		if n := got.count(e.Headers["Delayd-Id"]); (i == bad && n != 0) || (i != bad && n != 1) {
			t.Errorf("%s delivered %d times", e.Headers["Delayd-Id"], n)
		}
	}

	var over []wireEntry
	for i := range 51 {
		over = append(over, wireEntry{Headers: map[string]string{"Delayd-Target": "batch.t", "Delayd-Delay": "1h", "Delayd-Id": fmt.Sprintf("o%d", i)}})
	}
	if _, refused := sendBatch(t, nc, over); refused != "413 the batch holds 51 envelopes, over the limit of 50 (intake.max_batch): nothing of it was stored" {
		t.Errorf("over max_batch: %q", refused)
	}
	if _, err := dc.Get(context.Background(), "o0"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("an envelope of a refused batch: %v, want not found", err)
	}
	if p := pending(t, dc); p != 0 {
		t.Errorf("%d pending after a refused batch", p)
	}
}
