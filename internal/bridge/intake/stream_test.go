package intake

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// streamEnv is a real nats-server with JetStream, a real redis-server and
// the store on it.
type streamEnv struct {
	t     *testing.T
	url   string // where the intake connects (the server, or a proxy)
	nats  *testutil.NATS
	redis *testutil.Redis
	st    *store.Store
	obs   *streamCounts
	log   hclog.Logger  // the intakes' logger, when set
	si    *StreamIntake // the intake start ran last
}

func newStreamEnv(t *testing.T, natsOpts ...func(*server.Options)) *streamEnv {
	t.Helper()
	e := &streamEnv{t: t, nats: testutil.StartNATS(t, natsOpts...), redis: testutil.StartRedis(t), obs: &streamCounts{n: map[string]int{}}}
	e.url = e.nats.URL()
	e.st = store.New(store.NewClient(store.Options{Addrs: []string{e.redis.Addr}}), "streamtest", 4)
	t.Cleanup(func() { e.st.Close() })
	return e
}

// streamCounts records what the intake counted.
type streamCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *streamCounts) StreamIntake(result string, n int) {
	c.mu.Lock()
	c.n[result] += n
	c.mu.Unlock()
}
func (c *streamCounts) RedisError(string) {}
func (c *streamCounts) get(result string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[result]
}

type noWake struct{}

func (noWake) Wake(int, int64) {}

func (e *streamEnv) conn() *nats.Conn {
	e.t.Helper()
	nc, err := nats.Connect(e.nats.URL())
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(nc.Close)
	return nc
}

// start runs a stream intake over st until the returned stop is called.
func (e *streamEnv) start(st StreamStore, mod ...func(*StreamOptions)) (stop func()) {
	e.t.Helper()
	opt := StreamOptions{Options: Options{Subject: "delayd", Batch: 32, storeTimeout: 2 * time.Second, Limits: envelope.Limits{MaxIDLen: 256, MaxHeaders: 64, MaxHeaderBytes: 16 << 10, MaxDelay: time.Hour}},
		Name: "DELAYD_INTAKE", Replicas: 1, Pull: 64, AckWait: 30 * time.Second, RetryDelay: 50 * time.Millisecond}
	for _, m := range mod {
		m(&opt)
	}
	nc, err := nats.Connect(e.url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		e.t.Fatal(err)
	}
	log := hclog.NewNullLogger()
	switch {
	case e.log != nil:
		log = e.log
	case os.Getenv("DELAYD_TEST_LOG") != "":
		log = hclog.New(&hclog.LoggerOptions{Level: hclog.Debug})
	}
	si := NewStreamIntake(nc, st, noWake{}, e.obs, opt, log)
	e.si = si
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- si.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				e.t.Errorf("stream intake: %v", err)
			}
		})
	}
	e.t.Cleanup(stop)
	e.waitStream()
	return stop
}

// rejected subscribes to delayd.rejected, the copies of refused envelopes.
func (e *streamEnv) rejected() <-chan *nats.Msg {
	e.t.Helper()
	nc := e.conn()
	ch := make(chan *nats.Msg, 10)
	if _, err := nc.ChanSubscribe("delayd.rejected", ch); err != nil {
		e.t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		e.t.Fatal(err)
	}
	return ch
}

// waitStream waits until the stream and its consumer exist.
func (e *streamEnv) waitStream() {
	e.t.Helper()
	js := e.js()
	e.eventually("the stream and consumer exist", func() bool {
		// Or, half-way through a migration, those of the stream between.
		for _, name := range []string{"DELAYD_INTAKE", interimName("DELAYD_INTAKE")} {
			if _, err := js.Consumer(context.Background(), name, name); err == nil {
				return true
			}
		}
		return false
	})
}

func (e *streamEnv) js() jetstream.JetStream {
	js, err := jetstream.New(e.conn())
	if err != nil {
		e.t.Fatal(err)
	}
	return js
}

// eventually polls cond until it holds, failing after a generous deadline
// (a hang guard, not a timed assertion).
func (e *streamEnv) eventually(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *streamEnv) pending() int64 {
	shards, _, err := e.st.Stats(context.Background())
	if err != nil {
		return -1
	}
	var n int64
	for _, sh := range shards {
		n += sh.Counts.Pending + sh.Counts.Inflight
	}
	return n
}

// streamLeft is what the stream still holds (not yet acknowledged).
func (e *streamEnv) streamLeft(js jetstream.JetStream) uint64 {
	e.t.Helper()
	s, err := js.Stream(context.Background(), "DELAYD_INTAKE")
	if err != nil {
		e.t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}

func publish(t *testing.T, js jetstream.JetStream, subject string, h nats.Header, payload string) {
	t.Helper()
	if _, err := js.PublishMsg(context.Background(), &nats.Msg{Subject: subject, Header: h, Data: []byte(payload)}); err != nil {
		t.Fatalf("publish to the intake stream: %v", err)
	}
}

func hdr(kv ...string) nats.Header {
	h := nats.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// Envelopes published while no delayd runs are stored once it starts,
// each acknowledged, the stream left empty; those without Delayd-Id get an
// id from the stream sequence.
func TestStreamIntakeStoresWhatWaited(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	e.start(e.st)() // creates the stream, then stops: no delayd runs now
	js := e.js()
	const n = 300
	for i := range n {
		h := hdr(envelope.HeaderTarget, "orders.cancel", envelope.HeaderDelay, "1h", "traceparent", "00-abc-01")
		subject := "delayd.intake"
		if i%2 == 0 {
			h.Set(envelope.HeaderID, fmt.Sprintf("w-%d", i))
			subject = "delayd.intake.orders"
		}
		publish(t, js, subject, h, fmt.Sprint("payload ", i))
	}
	if left := e.streamLeft(js); left != n {
		t.Fatalf("the stream holds %d of %d envelopes while no delayd runs", left, n)
	}
	e.start(e.st)
	e.eventually("every envelope is stored", func() bool { return e.pending() == n })
	e.eventually("the stream is empty", func() bool { return e.streamLeft(js) == 0 })
	if got := e.obs.get("stored"); got != n {
		t.Errorf("counted %d stored, want %d", got, n)
	}
	ent, err := e.st.Get(context.Background(), "w-0")
	if err != nil {
		t.Fatal(err)
	}
	env, err := envelope.Decode(ent.Data)
	if err != nil || string(env.Payload) != "payload 0" || env.Target != "orders.cancel" || nats.Header(env.Header).Get("traceparent") != "00-abc-01" {
		t.Errorf("stored envelope: %+v %v", env, err)
	}
	// An envelope without Delayd-Id is kept under s-<stream>-<sequence>:
	// the second message published has sequence 2.
	s, _ := js.Stream(context.Background(), "DELAYD_INTAKE")
	id := fmt.Sprintf("s-%s-2", strconv.FormatInt(s.CachedInfo().Created.UnixNano(), 36))
	if _, err := e.st.Get(context.Background(), id); err != nil {
		t.Errorf("no envelope %s: %v", id, err)
	}
}

// An invalid envelope is terminated, published to delayd.rejected with
// Delayd-Error and its original headers and payload, and counted.
func TestStreamIntakeRejects(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	e.start(e.st, func(o *StreamOptions) { o.Policy = envelope.Policy{Prefix: "delayd", Deny: []string{"secret.>"}} })
	rejected := e.rejected()
	js := e.js()
	publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "orders.>", envelope.HeaderDelay, "1s", "X-Trace", "t1"), "bad target")
	publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "secret.x", envelope.HeaderDelay, "1s"), "denied")
	publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "orders.ok", envelope.HeaderDelay, "1s", "Delayd-Id", "ok"), "fine")
	for i, want := range []struct{ code, payload, result string }{{"400", "bad target", "bad_request"}, {"403", "denied", "forbidden"}} {
		m := <-rejected
		if m.Header.Get(envelope.HeaderError) == "" || m.Header.Get(headerErrorCode) != want.code || string(m.Data) != want.payload {
			t.Errorf("rejected %d: %v %q", i, m.Header, m.Data)
		}
		if i == 0 && (m.Header.Get("X-Trace") != "t1" || m.Header.Get(envelope.HeaderTarget) != "orders.>") {
			t.Errorf("rejected message lost its original headers: %v", m.Header)
		}
		if got := e.obs.get(want.result); got != 1 {
			t.Errorf("counted %d %s, want 1", got, want.result)
		}
	}
	e.eventually("the valid one is stored", func() bool { return e.pending() == 1 })
	e.eventually("terminated and stored messages leave the stream", func() bool { return e.streamLeft(js) == 0 })
}

// unknownOnce stores through the real store but reports the first batch
// as an outcome unknown, as when Redis applied a write whose reply was
// lost: the messages are offered again and must replace, not duplicate.
type unknownOnce struct {
	*store.Store
	failed atomic.Bool
}

func (u *unknownOnce) Schedule(ctx context.Context, items []store.Item) ([]store.Scheduled, []error) {
	due, errs := u.Store.Schedule(ctx, items)
	if u.failed.CompareAndSwap(false, true) {
		for i := range errs {
			errs[i] = errors.Join(store.ErrOutcomeUnknown, errors.New("reply lost"))
		}
	}
	return due, errs
}

func TestStreamIntakeRedeliveryDoesNotDuplicate(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	u := &unknownOnce{Store: e.st}
	e.start(u, func(o *StreamOptions) { o.Batch = 1 })
	js := e.js()
	publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "orders.cancel", envelope.HeaderDelay, "1h"), "no id")
	e.eventually("the message is offered again and acknowledged", func() bool {
		// The first copy was stored (only its reply was lost): the
		// redelivery is acknowledged, not stored again.
		return e.obs.get("unavailable") == 1 && e.obs.get("redelivered") == 1 && e.streamLeft(js) == 0
	})
	if n := e.pending(); n != 1 {
		t.Fatalf("%d envelopes stored after a redelivery, want 1", n)
	}
}

// deliveredThenLost stores each batch, then deletes what it stored (as if
// the envelopes fell due and were delivered at once) and, the first time,
// answers as if the reply were lost: the stream offers the message again.
type deliveredThenLost struct {
	*store.Store
	failed atomic.Bool
}

func (s *deliveredThenLost) Schedule(ctx context.Context, items []store.Item) ([]store.Scheduled, []error) {
	due, errs := s.Store.Schedule(ctx, items)
	for _, it := range items {
		if _, err := s.Cancel(ctx, it.ID); err != nil {
			for i := range errs {
				errs[i] = err
			}
		}
	}
	if s.failed.CompareAndSwap(false, true) {
		for i := range errs {
			errs[i] = errors.Join(store.ErrOutcomeUnknown, errors.New("reply lost"))
		}
	}
	return due, errs
}

// A message stored, delivered, and offered again because its ack was lost
// is acknowledged and not stored again: a stream redelivery never
// schedules a timer twice. (Before, the redelivery stored it again, and it
// was delivered a second time as attempt 1.)
func TestStreamRedeliveryAfterDeliveryIsNotStoredAgain(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	u := &deliveredThenLost{Store: e.st}
	e.start(u, func(o *StreamOptions) { o.Batch = 1 })
	js := e.js()
	publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "orders.cancel", envelope.HeaderDelay, "1h",
		envelope.HeaderID, "once"), "x")
	e.eventually("the message is offered again and acknowledged", func() bool {
		return e.obs.get("unavailable") == 1 && e.obs.get("redelivered") == 1 && e.streamLeft(js) == 0
	})
	if got := e.obs.get("stored"); got != 0 {
		t.Fatalf("the redelivery was stored %d times, want 0", got)
	}
}

// With Redis down, messages stay in the stream; they are stored when Redis
// is back.
func TestStreamIntakeSurvivesRedisOutage(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	e.start(e.st)
	js := e.js()
	e.redis.Kill()
	const n = 50
	for i := range n {
		publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "orders.cancel", envelope.HeaderDelay, "1h",
			envelope.HeaderID, fmt.Sprint("o-", i)), "x")
	}
	e.eventually("a store attempt failed", func() bool { return e.obs.get("unavailable") > 0 })
	if left := e.streamLeft(js); left != n {
		t.Fatalf("the stream holds %d of %d envelopes while Redis is down", left, n)
	}
	e.redis.Start()
	e.eventually("every envelope is stored", func() bool { return e.pending() == n })
	e.eventually("the stream is empty", func() bool { return e.streamLeft(js) == 0 })
}

// A stream of the configured name that captures other subjects (another
// deployment's) is an error, never bound.
func TestStreamIntakeNameClash(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	js := e.js()
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "DELAYD_INTAKE", Subjects: []string{"other.intake"}}); err != nil {
		t.Fatal(err)
	}
	nc, _ := nats.Connect(e.nats.URL())
	si := NewStreamIntake(nc, e.st, noWake{}, e.obs, StreamOptions{Options: Options{Subject: "delayd"},
		Name: "DELAYD_INTAKE", Replicas: 1, AckWait: time.Second, RetryDelay: time.Second}, hclog.NewNullLogger())
	if err := si.Run(context.Background()); !errors.Is(err, errStreamClash) {
		t.Fatalf("Run on a clashing stream: %v", err)
	}
}

func TestIntakeHeadersDropsStreamPublishHeaders(t *testing.T) {
	t.Parallel()
	h := hdr("Nats-Msg-Id", "m1", "Nats-Expected-Last-Sequence", "3", "Nats-TTL", "1s", "X-A", "b")
	got := intakeHeaders(h)
	if len(got) != 2 || got.Get("Nats-TTL") != "1s" || got.Get("X-A") != "b" || len(h) != 4 {
		t.Fatalf("intakeHeaders: %v (input now %v)", got, h)
	}
}

// A stream deleted behind delayd's back is set up again, and envelopes
// published into the new one are stored: the intake never stops quietly.
func TestStreamIntakeSetsUpADeletedStreamAgain(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	e.start(e.st)
	js := e.js()
	publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "orders.cancel", envelope.HeaderDelay, "1h", "Delayd-Id", "before"), "x")
	e.eventually("stored before the deletion", func() bool { return e.pending() == 1 })
	if err := js.DeleteStream(context.Background(), "DELAYD_INTAKE"); err != nil {
		t.Fatal(err)
	}
	e.eventually("the stream is back", func() bool {
		_, err := js.Stream(context.Background(), "DELAYD_INTAKE")
		return err == nil
	})
	e.eventually("an envelope published into the new stream is stored", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		m := &nats.Msg{Subject: "delayd.intake", Header: hdr(envelope.HeaderTarget, "orders.cancel", envelope.HeaderDelay, "1h", "Delayd-Id", "after")}
		_, _ = js.PublishMsg(ctx, m)
		return e.pending() == 2
	})
}

// Found in review: a consumer deleted while the intake was cut off is only
// "no responders" after the reconnect; it must be set up again too.
func TestStreamIntakeSetsUpAConsumerDeletedWhileAway(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	proxy := testutil.StartProxy(t, fmt.Sprintf("127.0.0.1:%d", e.nats.Opts.Port))
	e.url = "nats://" + proxy.Addr()
	e.start(e.st)
	js := e.js()
	publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "orders.cancel", envelope.HeaderDelay, "1h", "Delayd-Id", "before"), "x")
	e.eventually("stored before", func() bool { return e.pending() == 1 })
	proxy.Set(testutil.Up, testutil.Fault{Drop: true})
	proxy.Set(testutil.Down, testutil.Fault{Drop: true})
	if err := js.DeleteConsumer(context.Background(), "DELAYD_INTAKE", "DELAYD_INTAKE"); err != nil {
		t.Fatal(err)
	}
	proxy.Clear()
	proxy.Cut()
	e.eventually("an envelope published after the reconnect is stored", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		m := &nats.Msg{Subject: "delayd.intake", Header: hdr(envelope.HeaderTarget, "orders.cancel", envelope.HeaderDelay, "1h", "Delayd-Id", "after")}
		_, _ = js.PublishMsg(ctx, m)
		return e.pending() == 2
	})
}

// The headers nats-server stamps on a sourced, republished or imported
// message are dropped, in any spelling; a publisher's other Nats-* header
// stays, to be refused.
func TestIntakeHeadersDropsStampedHeaders(t *testing.T) {
	t.Parallel()
	h := hdr("Nats-Stream-Source", "ORIGIN 1 > > orders.x Bah0WAb0", "Nats-Stream", "R", "Nats-Subject", "rp.x",
		"Nats-Sequence", "1", "Nats-Time-Stamp", "2026-01-01T00:00:00Z", "Nats-Last-Sequence", "0", "Nats-Msg-Size", "3",
		"Nats-Request-Info", `{"acc":"A"}`, "Nats-Rollup", "all", "X-A", "b")
	h["nats-stream-source"] = []string{"lower"} // not canonical, as a raw header may be
	got := intakeHeaders(h)
	if len(got) != 2 || got.Get("Nats-Rollup") != "all" || got.Get("X-A") != "b" {
		t.Fatalf("intakeHeaders: %v", got)
	}
}

// floorDown is a store whose floor cannot be read while down is set.
type floorDown struct {
	StreamStore
	down  atomic.Bool
	asked atomic.Int64 // floors asked for while down
}

func (f *floorDown) IntakeFloor(ctx context.Context, name string, created int64) (uint64, error) {
	if f.down.Load() {
		f.asked.Add(1)
		return 0, errors.New("redis down")
	}
	return f.StreamStore.IntakeFloor(ctx, name, created)
}

// On a limits-retention stream, a consumer is never created without its
// floor: while Redis cannot say it, none is (a consumer from the stream's
// first message would store everything again); then it starts after it.
func TestStreamIntakeConsumerWaitsForTheFloor(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	js := e.js()
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DELAYD_INTAKE", Subjects: []string{"delayd.intake", "delayd.intake.>"},
		Retention: jetstream.LimitsPolicy}); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "DELAYD_INTAKE")
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.st.SaveIntakeFloor(ctx, "DELAYD_INTAKE", info.Created.UnixNano(), 7); err != nil {
		t.Fatal(err)
	}
	fd := &floorDown{StreamStore: e.st}
	fd.down.Store(true)
	nc := e.conn()
	si := NewStreamIntake(nc, fd, noWake{}, e.obs, StreamOptions{Options: Options{Subject: "delayd"},
		Name: "DELAYD_INTAKE", Replicas: 1, AckWait: time.Second, RetryDelay: time.Second}, hclog.NewNullLogger())
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- si.Run(rctx) }()
	defer func() { cancel(); <-done }()
	// Not created while the floor is unknown: checked once the intake has
	// asked for it, and retried, in vain.
	e.eventually("the floor asked for twice", func() bool { return fd.asked.Load() >= 2 })
	if _, err := js.Consumer(ctx, "DELAYD_INTAKE", "DELAYD_INTAKE"); err == nil {
		t.Fatal("the consumer was created without its floor")
	}
	fd.down.Store(false)
	e.waitStream()
	cons, err := js.Consumer(ctx, "DELAYD_INTAKE", "DELAYD_INTAKE")
	if err != nil {
		t.Fatal(err)
	}
	if c := cons.CachedInfo().Config; c.DeliverPolicy != jetstream.DeliverByStartSequencePolicy || c.OptStartSeq != 8 {
		t.Fatalf("consumer starts with %v at %d, want by start sequence at 8", c.DeliverPolicy, c.OptStartSeq)
	}
}

// A batch message on the durable intake: each bad envelope goes to
// delayd.rejected alone, the rest are stored, and the message is acked
// once, when all are. Here the first pipeline's outcome is unknown, so the
// message is offered again: the envelopes stored already are recognised by
// their place in the message and not stored again, and the bad ones are
// published to delayd.rejected again. A batch over intake.max_batch is
// rejected whole, nothing of it stored.
func TestStreamIntakeBatch(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	u := &unknownOnce{Store: e.st}
	e.start(u, func(o *StreamOptions) { o.Batch = 2; o.MaxBatch = 5 })
	rejected := e.rejected()
	js := e.js()
	body := batchBody(t,
		hdr(envelope.HeaderTarget, "orders.a", envelope.HeaderDelay, "1h", envelope.HeaderID, "sb1"),
		hdr(envelope.HeaderTarget, "orders.>", envelope.HeaderDelay, "1h", "X-Trace", "t1"),
		hdr(envelope.HeaderTarget, "orders.b", envelope.HeaderDelay, "1h"),
		hdr(envelope.HeaderTarget, "orders.c", envelope.HeaderDelay, "1h", envelope.HeaderID, "sb1"),
		hdr(envelope.HeaderTarget, "orders.d", envelope.HeaderDelay, "1h", envelope.HeaderID, "sb4"),
	)
	publish(t, js, "delayd.intake", hdr(envelope.HeaderBatch, envelope.BatchJSON), string(body))
	e.eventually("the batch is stored and acked after one redelivery", func() bool {
		return e.obs.get("redelivered") == 3 && e.streamLeft(js) == 0
	})
	// The first pipeline took one or two envelopes (its outcome unknown);
	// the rest were stored on the first round.
	if n, s, f := e.pending(), e.obs.get("stored"), e.obs.get("unavailable"); n != 3 || s+f != 3 || f < 1 {
		t.Errorf("%d envelopes stored, counted stored %d and unavailable %d; want 3 stored, 3 counted in all on the first round", n, s, f)
	}
	for i := range 4 { // two refused envelopes, in each of the two rounds
		m := <-rejected
		if m.Header.Get(headerErrorCode) != "400" {
			t.Errorf("rejected copy %d: %v %q", i, m.Header, m.Data)
		}
		if m.Header.Get("X-Trace") == "t1" && (string(m.Data) != "payload 1" || m.Header.Get(envelope.HeaderTarget) != "orders.>") {
			t.Errorf("rejected envelope lost its headers or payload: %v %q", m.Header, m.Data)
		}
	}
	s, _ := js.Stream(context.Background(), "DELAYD_INTAKE")
	id := fmt.Sprintf("s-%s-1-2", strconv.FormatInt(s.CachedInfo().Created.UnixNano(), 36))
	if _, err := e.st.Get(context.Background(), id); err != nil {
		t.Errorf("no envelope %s (the one without an id, named by its place): %v", id, err)
	}

	over := batchBody(t, schedule("orders.a", "o1"), schedule("orders.a", "o2"), schedule("orders.a", "o3"),
		schedule("orders.a", "o4"), schedule("orders.a", "o5"), schedule("orders.a", "o6"))
	publish(t, js, "delayd.intake", hdr(envelope.HeaderBatch, envelope.BatchJSON), string(over))
	m := <-rejected
	if m.Header.Get(headerErrorCode) != "413" || string(m.Data) != string(over) {
		t.Errorf("batch over max_batch: %v", m.Header)
	}
	e.eventually("the refused batch leaves the stream", func() bool { return e.streamLeft(js) == 0 })
	if n := e.pending(); n != 3 {
		t.Errorf("%d envelopes stored after a refused batch, want still 3", n)
	}
}

// The stream delayd creates keeps messages by limits, not as a work
// queue: an ack deletes nothing (nats-server spent most of its time on the
// intake deleting acked messages one at a time), and the daemons purge
// whole ranges below the consumer's ack floor instead. Two daemons share
// the consumer; what both settled is purged, nothing else.
func TestStreamIntakePurgesBelowTheAckFloor(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	e.start(e.st)
	e.start(e.st)
	js := e.js()
	ctx := context.Background()
	s, err := js.Stream(ctx, "DELAYD_INTAKE")
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.Retention != jetstream.LimitsPolicy || c.Metadata[layoutKey] != layoutPurged {
		t.Fatalf("created stream: retention %v, metadata %v; want limits, %s=%s", c.Retention, c.Metadata, layoutKey, layoutPurged)
	}
	const n = 200
	for i := range n {
		publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "orders.cancel", envelope.HeaderDelay, "1h",
			envelope.HeaderID, fmt.Sprint("p-", i)), "x")
	}
	e.eventually("every envelope is stored", func() bool { return e.pending() == n })
	e.eventually("the settled messages are purged", func() bool {
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs == 0 && info.State.FirstSeq == n+1
	})
	if got := e.obs.get("stored"); got != n {
		t.Errorf("counted %d stored, want %d", got, n)
	}
}

// A limits stream an operator made (without delayd's layout mark) may have
// other readers: delayd never purges it, whatever it settled.
func TestStreamIntakeNeverPurgesAnOperatorsStream(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	js := e.js()
	ctx := context.Background()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DELAYD_INTAKE", Subjects: []string{"delayd.intake", "delayd.intake.>"},
		Retention: jetstream.LimitsPolicy})
	if err != nil {
		t.Fatal(err)
	}
	e.start(e.st)
	const n = 50
	for i := range n {
		publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "orders.cancel", envelope.HeaderDelay, "1h",
			envelope.HeaderID, fmt.Sprint("k-", i)), "x")
	}
	e.eventually("every envelope is stored", func() bool { return e.pending() == n })
	// Once the floor of all n is saved, a purge would have followed it.
	created := s.CachedInfo().Created.UnixNano()
	e.eventually("the floor is saved", func() bool {
		f, err := e.st.IntakeFloor(ctx, "DELAYD_INTAKE", created)
		return err == nil && f == n
	})
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != n {
		t.Fatalf("the operator's stream holds %d of %d messages: delayd purged it", info.State.Msgs, n)
	}
}

// intake.stream.retention: workqueue creates the layout before 0.2.0:
// each ack deletes its message, nothing to purge.
func TestStreamIntakeWorkQueueLayout(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	e.start(e.st, func(o *StreamOptions) { o.WorkQueue = true })
	js := e.js()
	s, err := js.Stream(context.Background(), "DELAYD_INTAKE")
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.Retention != jetstream.WorkQueuePolicy || c.Metadata[layoutKey] != "" {
		t.Fatalf("created stream: retention %v, metadata %v; want a work queue, unmarked", c.Retention, c.Metadata)
	}
	publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "orders.cancel", envelope.HeaderDelay, "1h", envelope.HeaderID, "wq"), "x")
	e.eventually("stored", func() bool { return e.pending() == 1 })
	e.eventually("the stream is empty", func() bool { return e.streamLeft(js) == 0 })
}

// An operator who takes delayd's layout mark off a running stream (it has
// readers of its own now) stops the purges at once, without a restart.
func TestStreamIntakeStopsPurgingWhenUnmarked(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	e.start(e.st)
	js := e.js()
	ctx := context.Background()
	s, err := js.Stream(ctx, "DELAYD_INTAKE")
	if err != nil {
		t.Fatal(err)
	}
	pub := func(from, n int) {
		for i := from; i < from+n; i++ {
			publish(t, js, "delayd.intake", hdr(envelope.HeaderTarget, "orders.cancel", envelope.HeaderDelay, "1h",
				envelope.HeaderID, fmt.Sprint("u-", i)), "x")
		}
	}
	pub(0, 10)
	e.eventually("the first ten purged", func() bool {
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs == 0 && info.State.FirstSeq == 11
	})
	cfg := s.CachedInfo().Config
	cfg.Metadata = map[string]string{"owner": "ops"}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	pub(10, 10)
	e.eventually("all twenty stored", func() bool { return e.pending() == 20 })
	created := s.CachedInfo().Created.UnixNano()
	e.eventually("the floor of all twenty saved", func() bool {
		f, err := e.st.IntakeFloor(ctx, "DELAYD_INTAKE", created)
		return err == nil && f == 20
	})
	// A purge would follow the save within purgeEvery: wait that out.
	time.Sleep(2 * purgeEvery)
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 10 {
		t.Fatalf("the unmarked stream holds %d messages, want the 10 published after the mark went", info.State.Msgs)
	}
}

// A rejected copy carries delayd's Delayd-Error and Delayd-Error-Code
// alone: a publisher's own, in any case, is dropped (a lower-case
// delayd-error-code: 200 rode along next to the 400), and an envelope of
// a batch is named once ("envelope 1 of a batch: envelope 1: ..." before).
func TestStreamIntakeRejectedCopyHeaders(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	e.start(e.st)
	rejected := e.rejected()
	js := e.js()
	forged := nats.Header{envelope.HeaderTarget: {"orders.a"}, envelope.HeaderDelay: {"1h"},
		"delayd-error-code": {"200"}, "DELAYD-ERROR": {"all fine"}}
	body := string(batchBody(t, forged))
	body = body[:len(body)-1] + `,42]`
	publish(t, js, "delayd.intake", hdr(envelope.HeaderBatch, envelope.BatchJSON), body)
	publish(t, js, "delayd.intake", forged, "single")
	for range 3 {
		m := <-rejected
		var codes, errs []string
		for k, v := range m.Header {
			if strings.EqualFold(k, headerErrorCode) {
				codes = append(codes, v...)
			}
			if strings.EqualFold(k, envelope.HeaderError) {
				errs = append(errs, v...)
			}
		}
		if len(codes) != 1 || codes[0] != "400" || len(errs) != 1 || errs[0] == "all fine" {
			t.Errorf("rejected copy %q: codes %q, errors %q; want only delayd's 400", m.Data, codes, errs)
		}
		if len(errs) == 1 && strings.Count(errs[0], "envelope ") > 1 {
			t.Errorf("the envelope named twice: %s", errs[0])
		}
	}
}

// A refused stream message whose copy cannot be published as it is (its
// payload near max_payload leaves no room for delayd's error headers)
// still reaches delayd.rejected: as its error, code and size alone, never
// only a line in the log.
func TestStreamIntakeRejectedCopyTooLarge(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t, func(o *server.Options) { o.MaxPayload = 8192 })
	e.start(e.st)
	rejected := e.rejected()
	js := e.js()
	h := hdr(envelope.HeaderTarget, "orders.>", envelope.HeaderDelay, "1s")
	payload := strings.Repeat("x", 8192-100) // room for its own headers, not the error
	publish(t, js, "delayd.intake", h, payload)
	select {
	case m := <-rejected:
		if m.Header.Get(headerErrorCode) != "400" || !strings.Contains(m.Header.Get(envelope.HeaderError), "dropped") ||
			m.Header.Get(headerRejectedBytes) != strconv.Itoa(len(payload)) || len(m.Data) != 0 {
			t.Fatalf("rejected copy: %v, %d bytes", m.Header, len(m.Data))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no copy on delayd.rejected")
	}
}
