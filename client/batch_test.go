package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/client"
)

// TestScheduleBatch against the real daemon: each envelope stands alone.
// The stored ones come back with their ids and due times, each refusal
// with its own code, and an envelope whose options are wrong is refused
// before sending while the rest go out.
func TestScheduleBatch(t *testing.T) {
	nc := connect(t)
	defer nc.Close()
	c := client.New(nc)
	ctx := context.Background()
	before := time.Now()
	res, err := c.ScheduleBatch(ctx, []client.Envelope{
		{Target: "orders.batch", Payload: []byte("one"), Options: []client.ScheduleOption{client.Delay(time.Hour), client.ID("sb-1"), client.Header("X-Trace", "a\"b")}},
		{Target: "orders.*", Options: []client.ScheduleOption{client.Delay(time.Hour)}},
		{Target: "$SYS.x", Options: []client.ScheduleOption{client.Delay(time.Hour)}},
		{Target: "orders.batch"}, // no time: refused before sending
		{Target: "orders.batch", Payload: []byte{0, 1, 2, 255}, Options: []client.ScheduleOption{client.Delay(time.Hour)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 5 {
		t.Fatalf("%d results", len(res))
	}
	if r := res[0]; r.Err != nil || r.ID != "sb-1" || r.DeliverAt.Before(before.Add(time.Hour-time.Second)) {
		t.Errorf("stored: %+v", r)
	}
	var se *client.ServiceError
	if r := res[1]; !errors.Is(r.Err, client.ErrBadRequest) || !errors.As(r.Err, &se) || se.Code != 400 {
		t.Errorf("wildcard target: %v", r.Err)
	}
	if r := res[2]; !errors.Is(r.Err, client.ErrForbidden) {
		t.Errorf("$SYS target: %v", r.Err)
	}
	if r := res[3]; !errors.Is(r.Err, client.ErrBadRequest) || errors.As(r.Err, &se) && se.Code == 400 && strings.Contains(se.Message, "envelope") {
		t.Errorf("no time: %v, want refused before sending", r.Err)
	}
	if r := res[4]; r.Err != nil || r.ID == "" {
		t.Errorf("stored with an id the daemon made: %+v", r)
	}
	e, err := c.Get(ctx, "sb-1")
	if err != nil || e.Size != 3 || e.Target != "orders.batch" || len(e.Header["X-Trace"]) != 1 || e.Header["X-Trace"][0] != "a\"b" {
		t.Errorf("stored envelope: %+v %v", e, err)
	}
	if got, err := c.Get(ctx, res[4].ID); err != nil || got.Size != 4 {
		t.Errorf("binary payload: %+v %v", got, err)
	}
	for _, id := range []string{"sb-1", res[4].ID} {
		_, _ = c.Cancel(ctx, id)
	}
}

// A batch refused as a whole is an error of the call, with no results.
func TestScheduleBatchRefusedWhole(t *testing.T) {
	nc := connect(t)
	defer nc.Close()
	startFake(t, nc, "bigbatch", func(int, *nats.Msg) *nats.Msg {
		return serviceError("413", "the batch holds 2 envelopes, over the limit of 1 (intake.max_batch)", "")
	})
	two := []client.Envelope{
		{Target: "a.b", Options: []client.ScheduleOption{client.Delay(time.Second)}},
		{Target: "a.c", Options: []client.ScheduleOption{client.Delay(time.Second)}},
	}
	res, err := client.New(nc, client.Prefix("bigbatch")).ScheduleBatch(context.Background(), two)
	if !errors.Is(err, client.ErrTooLarge) || res != nil {
		t.Errorf("over max_batch: %v %v", res, err)
	}
	if _, err := client.New(nc, client.Prefix("nobody")).ScheduleBatch(context.Background(), two); !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("no daemon: %v", err)
	}
}

// batchFake answers batch requests on <prefix>.schedule as a daemon
// would: each envelope stored under its Delayd-Id, or refused with 403
// when its target starts with "deny.", or its payload is "slow" and the
// reply is held back. It records the size of every batch.
type batchFake struct {
	mu      sync.Mutex
	batches []int
}

func startBatchFake(t *testing.T, nc *nats.Conn, prefix string) *batchFake {
	t.Helper()
	f := &batchFake{}
	sub, err := nc.Subscribe(prefix+".schedule", func(m *nats.Msg) {
		var entries []struct {
			Headers map[string]string `json:"headers"`
			Payload []byte            `json:"payload"`
		}
		if m.Header.Get("Delayd-Batch") != "json" || json.Unmarshal(m.Data, &entries) != nil {
			t.Errorf("not a batch: %v %q", m.Header, m.Data)
			return
		}
		f.mu.Lock()
		f.batches = append(f.batches, len(entries))
		f.mu.Unlock()
		var out []string
		for _, e := range entries {
			if string(e.Payload) == "slow" {
				return // never answered
			}
			if strings.HasPrefix(e.Headers["Delayd-Target"], "deny.") {
				out = append(out, `{"code":403,"error":"denied `+e.Headers["Delayd-Id"]+`"}`)
				continue
			}
			out = append(out, fmt.Sprintf(`{"id":%q,"deliver_at":"2030-01-01T00:00:00Z"}`, e.Headers["Delayd-Id"]))
		}
		_ = m.Respond([]byte(`{"results":[` + strings.Join(out, ",") + `]}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *batchFake) sizes() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.batches...)
}

// TestBatchingGathersConcurrentCalls: with Batching, concurrent Schedule
// calls leave in batch requests of at most the size given, and every
// caller gets its own result or error.
func TestBatchingGathersConcurrentCalls(t *testing.T) {
	nc := connect(t)
	defer nc.Close()
	f := startBatchFake(t, nc, "batching")
	c := client.New(nc, client.Prefix("batching"), client.Batching(16, time.Millisecond))
	defer c.Close()
	const calls = 200
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for i := 0; i < calls; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id := fmt.Sprintf("call-%d", i)
			target := "orders.x"
			if i%7 == 0 {
				target = "deny.x"
			}
			s, err := c.Schedule(context.Background(), target, []byte("p"), client.Delay(time.Minute), client.ID(id))
			switch {
			case i%7 == 0 && !errors.Is(err, client.ErrForbidden):
				errs <- fmt.Errorf("%s: %v, want its own 403", id, err)
			case i%7 == 0 && !strings.Contains(err.Error(), "denied "+id):
				errs <- fmt.Errorf("%s: %v, want its own refusal", id, err)
			case i%7 != 0 && (err != nil || s.ID != id):
				errs <- fmt.Errorf("%s: %+v %v, want stored under its own id", id, s, err)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	sizes := f.sizes()
	sum := 0
	for _, n := range sizes {
		sum += n
		if n > 16 {
			t.Errorf("a batch of %d, over the size of 16", n)
		}
	}
	if sum != calls || len(sizes) >= calls {
		t.Errorf("%d calls went out in %d batches (%v), want every call, in fewer requests than calls", sum, len(sizes), sizes)
	}

	// Options wrong: refused before sending, as without batching.
	if _, err := c.Schedule(context.Background(), "orders.x", nil); !errors.Is(err, client.ErrBadRequest) {
		t.Errorf("no time: %v", err)
	}
}

// A batched call whose context ends before its batch is answered may have
// been stored: ErrOutcomeUnknown with its id. After Close, a call is not
// sent.
func TestBatchingUnknownOutcomeAndClose(t *testing.T) {
	nc := connect(t)
	defer nc.Close()
	startBatchFake(t, nc, "batchslow")
	c := client.New(nc, client.Prefix("batchslow"), client.Batching(0, 0), client.RetryTimeout(200*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.Schedule(ctx, "orders.x", []byte("slow"), client.Delay(time.Minute), client.ID("slow-1"))
	if !errors.Is(err, client.ErrOutcomeUnknown) || !strings.Contains(err.Error(), "retry with id slow-1") {
		t.Errorf("unanswered: %v", err)
	}
	done := make(chan struct{})
	go func() { c.Close(); close(done) }()
	<-done
	if _, err := c.Schedule(context.Background(), "orders.x", nil, client.Delay(time.Minute)); !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("after Close: %v", err)
	}
}

// Batching against the real daemon: calls stored, refusals their own.
func TestBatchingOnTheDaemon(t *testing.T) {
	nc := connect(t)
	defer nc.Close()
	c := client.New(nc, client.Batching(8, time.Millisecond))
	defer c.Close()
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			target := "orders.batching"
			if i == 3 {
				target = "$SYS.x"
			}
			s, err := c.ScheduleRetrying(context.Background(), target, nil, client.Delay(time.Hour), client.ID(fmt.Sprintf("bt-%d", i)))
			if i == 3 && !errors.Is(err, client.ErrForbidden) || i != 3 && (err != nil || s.ID != fmt.Sprintf("bt-%d", i)) {
				t.Errorf("call %d: %+v %v", i, s, err)
			}
			_, _ = c.Cancel(context.Background(), fmt.Sprintf("bt-%d", i))
		}(i)
	}
	wg.Wait()
}

// Two concurrent calls of one ID never share a batch, where the daemon
// would refuse the second (400, "appears earlier in this batch"): each is
// stored, the later replacing the earlier, as when sent alone.
func TestBatchingOneIDTwice(t *testing.T) {
	nc := connect(t)
	defer nc.Close()
	c := client.New(nc, client.Batching(100, client.MaxLinger))
	defer c.Close()
	var wg sync.WaitGroup
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id := fmt.Sprintf("twice-%d", i/2)
			if s, err := c.Schedule(context.Background(), "orders.batching", nil, client.Delay(time.Hour), client.ID(id)); err != nil || s.ID != id {
				t.Errorf("call %d: %+v %v", i, s, err)
			}
		}(i)
	}
	wg.Wait()
	for i := 0; i < 50; i++ {
		_, _ = c.Cancel(context.Background(), fmt.Sprintf("twice-%d", i))
	}
}
