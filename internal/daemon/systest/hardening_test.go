package systest

// Regression tests for the defects the hardening review confirmed: each
// failed on the code before the fix.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/daemon"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// runDaemon runs a daemon in-process with its log captured; it returns
// the log, a channel with its result, and a stop function.
func runDaemon(t *testing.T, c config.Config) (*testutil.Buffer, <-chan error, context.CancelFunc) {
	t.Helper()
	logs := &testutil.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	// exited, not done, tells the cleanup the daemon is gone: a test that
	// read its result from done has emptied that.
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		done <- daemon.New(c, hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug})).Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
		}
	})
	return logs, done, cancel
}

// waitState polls until the envelope id is in state, or fails the test.
func waitState(t *testing.T, st *store.Store, id string, state store.State, d time.Duration) store.Entry {
	t.Helper()
	return waitEntry(t, st, id, d, "state "+string(state), func(e store.Entry) bool { return e.State == state })
}

// waitEntry waits up to d until ok holds for the entry of id, and returns
// the entry; want says what ok waits for.
func waitEntry(t *testing.T, st *store.Store, id string, d time.Duration, want string, ok func(store.Entry) bool) store.Entry {
	t.Helper()
	var e store.Entry
	var err error
	if !testutil.Eventually(d, func() bool {
		e, err = st.Get(context.Background(), id)
		return err == nil && ok(e)
	}) {
		t.Fatalf("%s: want %s, have %+v (%v)", id, want, e, err)
	}
	return e
}

// Defect 2: with several refused targets in one flush window, only the last
// -ERR was seen; the others were acked as delivered and deleted.
func TestSeveralRefusedTargetsInOneBatch(t *testing.T) {
	t.Parallel()
	e, c := refusingNATS(t)
	logs, _, _ := runDaemon(t, c)
	app, err := nats.Connect(e.NATS.URL(), nats.UserInfo("app", "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	paid := e.Sink(app, "payments.>")
	orders := e.Sink(app, "orders.>")
	at := time.Now().Add(1500 * time.Millisecond).UTC().Format(time.RFC3339Nano)
	var refused []string
	for i := range 10 {
		id := fmt.Sprintf("refused-%d", i)
		refused = append(refused, id)
		daemontest.ScheduleServed(t, app, daemontest.Hdr("Delayd-Target", fmt.Sprintf("payments.p%d", i), "Delayd-At", at, "Delayd-Id", id))
		daemontest.ScheduleServed(t, app, daemontest.Hdr("Delayd-Target", "orders.o", "Delayd-At", at, "Delayd-Id", fmt.Sprintf("ok-%d", i)))
	}
	if got := orders.WaitCount(10, 10*time.Second); got != 10 {
		t.Fatalf("allowed targets: %d of 10 delivered\n%s", got, logs.String())
	}
	st := e.InspectStore(c)
	for _, id := range refused {
		d := waitState(t, st, id, store.StateDead, 10*time.Second)
		if !strings.Contains(d.Error, "ermissions") || d.Attempts != 2 {
			t.Errorf("%s dead with %d attempts and error %q; want 2 and a permissions violation", id, d.Attempts, d.Error)
		}
	}
	if paid.Count() != 0 {
		t.Fatal("a refused publish was delivered")
	}
}

// natsBehindProxy is an env whose daemon config reaches NATS through a
// fault proxy, with a 1 s lease.
func natsBehindProxy(t *testing.T) (*daemontest.Env, *testutil.Proxy, config.Config) {
	e := daemontest.NewEnv(t)
	proxy := testutil.StartProxy(t, fmt.Sprintf("127.0.0.1:%d", e.NATS.Opts.Port))
	c := e.Config()
	c.NATS.URL = "nats://" + proxy.Addr()
	c.Scanner.Lease = time.Second
	return e, proxy, c
}

// Defect 3: a flush confirmation slower than the publish deadline was taken
// for "unreachable": the attempt was given back and the envelope went out
// again and again as attempt 1, never dead. Since a silent path counts as
// an outage (TestSilentPathIsAnOutage), a path whose round trip exceeds
// the lease's bounds (docs/operations.md) counts as down like a silent
// one: the daemon stops writing into it after one try and says so in
// /readyz, the envelope burns no attempt, and it is delivered once the
// path is fast again.
func TestSlowPathIsDownNotAttempts(t *testing.T) {
	t.Parallel()
	e, proxy, c := natsBehindProxy(t)
	c.Scanner.MaxAttempts = 3
	c.Scanner.RetryBackoff = 100 * time.Millisecond
	// Pings slow enough that the delivery's flush, not nats.go, finds
	// the path too slow.
	c.Ownership.TTL = 5 * time.Second
	e.StartDaemon(c)
	st := e.InspectStore(c)
	// Serving is not owning: the fault must find the shards held (and
	// the inbox proven), or there is nothing to give up and /readyz
	// names whatever it was still waiting for (two CI failures).
	waitOwned(t, st)
	nc := e.Conn() // direct, not through the proxy
	defer nc.Close()
	got := e.Sink(nc, "slow.flush")
	daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "slow.flush", "Delayd-Delay", "1s", "Delayd-Id", "slow"))
	// Every PONG (and everything else) from the server to delayd now
	// takes 2 s: no flush is confirmed within half the 1 s lease, nor a
	// probe within a quarter.
	proxy.Set(testutil.Down, testutil.Fault{Latency: 2 * time.Second})
	// The daemon gives its shards up, and says why it is not ready.
	var owners []string
	if !testutil.Eventually(30*time.Second, func() bool {
		var err error
		if owners, err = st.Owners(context.Background()); err != nil {
			t.Fatal(err)
		}
		return !slices.ContainsFunc(owners, func(o string) bool { return o != "" })
	}) {
		t.Fatalf("still owns shards behind a 2 s path: %v", owners)
	}
	if code, body := daemontest.HTTPGet(t, "http://"+c.HTTP.Addr+"/readyz"); code != 503 || !strings.Contains(body, "NATS") {
		t.Fatalf("readyz behind a 2 s path: %d %s", code, body)
	}
	got.Settle(t)
	if n := len(got.Get("slow")); n > 1 {
		t.Fatalf("delivered %d times into a path too slow to confirm: want at most one try", n)
	}
	if en, err := st.Get(context.Background(), "slow"); err != nil || en.State == store.StateDead || en.Attempts > 0 {
		t.Fatalf("behind the slow path: %+v %v; want it waiting, no attempt counted", en, err)
	}
	proxy.Clear()
	got.WaitIDs([]string{"slow"}, 20*time.Second)
	daemontest.Quiet(t, e, c, got)
	ds := got.Get("slow")
	if len(ds) == 0 || len(ds) > 2 {
		t.Fatalf("%d deliveries; want the one after the path healed, and at most one try before", len(ds))
	}
	for _, d := range ds {
		if d.Attempt != 1 {
			t.Errorf("delivered with attempt %d: the slow path was counted", d.Attempt)
		}
	}
}

// Defect 4: a request whose write timed out after it was sent got 503
// "nothing stored", yet it was stored and delivered. Now: 504 with the id,
// and a retry with that id replaces it.
func TestStoreTimeoutAnswers504WithID(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	got := e.Sink(nc, "unknown.outcome")
	e.Redis.Pause()
	resumed := make(chan struct{})
	go func() {
		defer close(resumed)
		time.Sleep(6 * time.Second)
		e.Redis.Resume()
	}()
	m := &nats.Msg{Subject: "delayd.schedule", Header: daemontest.Hdr("Delayd-Target", "unknown.outcome", "Delayd-Delay", "500ms"), Data: []byte("x")}
	rep, err := nc.RequestMsg(m, 10*time.Second)
	<-resumed
	if err != nil {
		t.Fatal(err)
	}
	if code := rep.Header.Get(micro.ErrorCodeHeader); code != "504" {
		t.Fatalf("want 504 for an unknown outcome, got %q %q", code, rep.Header.Get(micro.ErrorHeader))
	}
	var body struct{ ID string }
	if err := json.Unmarshal(rep.Data, &body); err != nil || body.ID == "" {
		t.Fatalf("504 without the id: %q %v", rep.Data, err)
	}
	// The retry with that id is an upsert: one envelope, one delivery.
	daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "unknown.outcome", "Delayd-Delay", "500ms", "Delayd-Id", body.ID))
	got.WaitCount(1, 10*time.Second)
	daemontest.Quiet(t, e, c, got)
	if n := len(got.Get(body.ID)); n != 1 {
		t.Fatalf("id %s delivered %d times; want once", body.ID, n)
	}
}

// Defect 5: over maxmemory with noeviction, heartbeats and ownership were
// refused (OOM), so no shard was ever owned and nothing due was delivered,
// while delivering is what frees memory. Schedules are refused whole (503).
func TestOverMaxmemoryStillDelivers(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	nc := e.Conn()
	defer nc.Close()
	got := e.Sink(nc, "oom.>")
	// The first daemon stores, then Redis goes over maxmemory.
	stop := e.StartDaemon(c)
	for i := range 20 {
		daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "oom.t", "Delayd-Delay", "3s", "Delayd-Id", fmt.Sprintf("oom-%d", i)))
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	rc := e.Redis.Client()
	if err := rc.ConfigSet(context.Background(), "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	// A new daemon must still take the shards and deliver.
	e.StartDaemon(c)
	rep, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "oom.t", "Delayd-Delay", "1s", "Delayd-Id", "refused"), "x")
	if err != nil || rep.Header.Get(micro.ErrorCodeHeader) != "503" {
		t.Errorf("schedule over maxmemory: want 503, got %v %v", err, rep.Header)
	}
	if n := got.WaitCount(20, 15*time.Second); n != 20 {
		t.Fatalf("over maxmemory, %d of 20 due envelopes delivered", n)
	}
	code, body := daemontest.HTTPGet(t, "http://"+c.HTTP.Addr+"/readyz")
	if code != 200 {
		t.Fatalf("readyz over maxmemory with shards owned: %d %s", code, body)
	}
	if got.Get("refused") != nil {
		t.Fatal("a refused schedule was delivered")
	}
}

// Defect 6: an evicting maxmemory-policy lost acknowledged envelopes
// silently. delayd refuses to start on one, and stops when a reconnect
// finds one, unless redis.allow_eviction says otherwise.
func TestEvictingRedisRefused(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t, "--maxmemory-policy", "allkeys-lru")
	c := e.Config()
	logs, done, _ := runDaemon(t, c)
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "maxmemory-policy") || !strings.Contains(err.Error(), "allkeys-lru") {
			t.Fatalf("want an error naming maxmemory-policy allkeys-lru, got %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("daemon started on an evicting Redis\n%s", logs.String())
	}
	c.Redis.AllowEviction = true
	logs, done, cancel := runDaemon(t, c)
	e.WaitService(c.Subject)
	if !strings.Contains(logs.String(), "REDIS MAY EVICT KEYS") {
		t.Errorf("allowed eviction without a loud warning:\n%s", logs.String())
	}
	cancel()
	<-done

	// On a good Redis that turns bad with CONFIG SET (no new connection),
	// the periodic re-check finds out.
	e2 := daemontest.NewEnv(t)
	c2 := e2.Config()
	_, done, _ = runDaemon(t, c2)
	e2.WaitService(c2.Subject)
	rc := e2.Redis.Client()
	_ = rc.ConfigSet(context.Background(), "maxmemory-policy", "volatile-lru").Err()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "volatile-lru") {
			t.Fatalf("want an error naming volatile-lru, got %v", err)
		}
	case <-time.After(25 * time.Second):
		t.Fatal("daemon kept running after Redis began to evict")
	}
}

// Defect 7: payloads close to the server's max_payload were accepted, then
// every delivery failed, because the delivery carries more headers.
func TestDeliveryMustFitMaxPayload(t *testing.T) {
	t.Parallel()
	e := &daemontest.Env{T: t, Redis: testutil.StartRedis(t), NATS: testutil.StartNATS(t, func(o *server.Options) { o.MaxPayload = 4096 })}
	c := e.Config()
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	got := e.Sink(nc, "big.>")
	rep, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "big.t", "Delayd-Delay", "10ms", "Delayd-Id", "too-big"), strings.Repeat("x", 4010)) // the request fits, the delivery (more headers) does not
	if err != nil {
		t.Fatal(err)
	}
	if code := rep.Header.Get(micro.ErrorCodeHeader); code != "413" || !strings.Contains(rep.Header.Get(micro.ErrorHeader), "max_payload") {
		t.Fatalf("want 413 naming max_payload, got %q %q", code, rep.Header.Get(micro.ErrorHeader))
	}
	daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "big.t", "Delayd-Delay", "10ms", "Delayd-Id", "fits"))
	if got.WaitCount(1, 5*time.Second) != 1 || got.Get("too-big") != nil {
		t.Fatal("want the small one delivered and the big one never")
	}
	// The delivery can reach the sink a moment before its ack lands.
	if !testutil.Eventually(5*time.Second, func() bool { return e.Stored(c) == 0 }) {
		t.Fatalf("%d envelopes stored; the refused one must not be", e.Stored(c))
	}
}

// Defect 10: retries waited for the idle interval instead of the retry
// backoff, and a replayed envelope for the next idle tick.
func TestRetryBackoffAndReplayWakeTheClock(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Scanner.IdleInterval = time.Hour // only wake-ups can deliver in time
	c.Scanner.Lease = time.Minute      // and no lease expiry either
	c.Scanner.RetryBackoff = 100 * time.Millisecond
	c.Scanner.MaxAttempts = 3
	c.Targets.JetStream = []string{"nostream.>"} // no stream: every publish fails
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "nostream.t", "Delayd-Delay", "10ms", "Delayd-Id", "r"))
	st := e.InspectStore(c)
	first := waitState(t, st, "r", store.StateDead, 10*time.Second)
	req := nats.NewMsg("delayd.admin.replay")
	req.Data = []byte(`{"ids":["r"]}`)
	if _, err := nc.RequestMsg(req, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// Dead again after three fresh attempts (4, 5, 6: attempts only go
	// up): the replay woke the clock.
	waitEntry(t, st, "r", 10*time.Second, "dead after attempt 6, retried promptly", func(en store.Entry) bool {
		return en.State == store.StateDead && en.Attempts == 6 && en.DueMs > first.DueMs
	})
}

// A Redis that answers slower than the client's read timeout: the write
// was sent, so the reply is 504 with the id, never 503; a retry with that
// id replaces it, and it is delivered once.
func TestSlowRedisReplyThroughProxy(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	proxy := testutil.StartProxy(t, e.Redis.Addr)
	c := e.Config()
	c.Redis.Addrs = []string{proxy.Addr()}
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	got := e.Sink(nc, "slow.redis")
	proxy.Set(testutil.Down, testutil.Fault{Latency: 4 * time.Second})
	m := &nats.Msg{Subject: "delayd.schedule", Header: daemontest.Hdr("Delayd-Target", "slow.redis", "Delayd-Delay", "10s"), Data: []byte("x")}
	rep, err := nc.RequestMsg(m, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code := rep.Header.Get(micro.ErrorCodeHeader); code != "504" {
		t.Fatalf("slow Redis reply: want 504, got %q %q", code, rep.Header.Get(micro.ErrorHeader))
	}
	var body struct{ ID string }
	_ = json.Unmarshal(rep.Data, &body)
	proxy.Clear()
	// Let the replies already delayed drain: a connection delivers in
	// order, so a retry sent now could wait behind them and time out too.
	// A cancel of an unknown id reads Redis through the same path: once
	// one is answered at once, and not 503 or 504, the path is clear.
	for deadline := time.Now().Add(10 * time.Second); ; {
		probe := &nats.Msg{Subject: "delayd.cancel", Header: daemontest.Hdr("Delayd-Id", "drain-probe")}
		rep, err := nc.RequestMsg(probe, 500*time.Millisecond)
		if err == nil && rep.Header.Get(micro.ErrorCodeHeader) != "503" && rep.Header.Get(micro.ErrorCodeHeader) != "504" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the delayed Redis replies did not drain: %v", err)
		}
	}
	// The first write happened (the envelope is pending for 10 s): the
	// retry with its id replaces it, so it is delivered once.
	daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "slow.redis", "Delayd-Delay", "100ms", "Delayd-Id", body.ID))
	got.WaitCount(1, 10*time.Second)
	daemontest.Quiet(t, e, c, got)
	if n := len(got.Get(body.ID)); n != 1 {
		t.Fatalf("delivered %d times, want once", n)
	}
}

// A Redis link cut in the middle of pipelines, over and over, while
// schedules and deliveries flow: answers are 503 or 504, never a false
// "stored"; everything acknowledged is delivered; the data stays consistent.
func TestRedisLinkCutMidPipeline(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	proxy := testutil.StartProxy(t, e.Redis.Addr)
	c := daemontest.JetStreamConfig(e)
	c.Redis.Addrs = []string{proxy.Addr()}
	f := daemontest.NewWorkload(e, "cut")
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	stopCuts := make(chan struct{})
	cutsDone := make(chan int)
	go func() {
		cuts := 0
		for {
			select {
			case <-stopCuts:
				proxy.Clear()
				cutsDone <- cuts
				return
			case <-time.After(300 * time.Millisecond):
			}
			proxy.Set(testutil.Up, testutil.Fault{CutAfter: 200 + cuts*37%1500})
			cuts++
		}
	}()
	start := time.Now().Add(time.Second)
	f.Schedule(nc, 1500, start, 3*time.Second, time.Now().Add(20*time.Second))
	time.Sleep(time.Until(start.Add(3 * time.Second)))
	close(stopCuts)
	t.Logf("%d cuts", <-cutsDone)
	f.Verify(t, 20*time.Second)
	st := e.InspectStore(c)
	for sh := range c.Shards { // what delayd doctor checks
		found, err := st.Check(context.Background(), sh, store.CheckOptions{})
		if err != nil || len(found) > 0 {
			t.Errorf("shard %d inconsistent after cuts: %v %v", sh, found, err)
		}
	}
}

// A NATS link that takes delayd's publishes and then is cut before the
// flush is confirmed: the message may be lost or delivered, so it is an
// attempt; the envelope arrives, and any second copy has a higher attempt.
// A cut is not silence: it comes within the flush's deadline (half the
// lease) and before the pings (a quarter of ownership.ttl apart) find the
// path silent.
func TestNATSLinkCutBetweenPublishAndFlush(t *testing.T) {
	t.Parallel()
	e, proxy, c := natsBehindProxy(t)
	c.Scanner.Lease, c.Ownership.TTL = 10*time.Second, 10*time.Second
	// Fire and forget: no stream list read before the batch, over the
	// stalled path, so the publish is written before the cut.
	c.Targets.FireAndForget = []string{"cut.flush"}
	e.StartDaemon(c)
	// Ownership rounds are ttl/3 apart: wait for the shards, so the
	// envelope is claimed at its due time, before the cut.
	waitOwned(t, e.InspectStore(c))
	nc := e.Conn()
	defer nc.Close()
	got := e.Sink(nc, "cut.flush")
	daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "cut.flush", "Delayd-Delay", "1s", "Delayd-Id", "cf"))
	// Hold everything delayd sends (the publish and the flush's PING),
	// then cut the connection with it all still held.
	proxy.Set(testutil.Up, testutil.Fault{Stall: true})
	time.Sleep(1800 * time.Millisecond)
	proxy.Cut()
	proxy.Clear()
	if got.WaitCount(1, 15*time.Second) < 1 {
		t.Fatal("never delivered after the cut")
	}
	daemontest.Quiet(t, e, c, got)
	seen := map[int]bool{}
	for _, d := range got.Get("cf") {
		if seen[d.Attempt] {
			t.Fatalf("attempt %d delivered twice", d.Attempt)
		}
		seen[d.Attempt] = true
		if d.Attempt < 2 {
			t.Errorf("the publish held at the cut counted no attempt: delivered as attempt %d", d.Attempt)
		}
	}
}

// waitOwned waits until every shard has an owner.
func waitOwned(t testing.TB, st *store.Store) {
	t.Helper()
	var owners []string
	if !testutil.Eventually(20*time.Second, func() bool {
		var err error
		if owners, err = st.Owners(context.Background()); err != nil {
			t.Fatal(err)
		}
		return !slices.Contains(owners, "")
	}) {
		t.Fatalf("shards without an owner: %v", owners)
	}
}

// refusingNATS is a server where delayd's user may publish only to orders.>
// (and what the service itself needs); app may do anything.
func refusingNATS(t *testing.T) (*daemontest.Env, config.Config) {
	e := &daemontest.Env{T: t, Redis: testutil.StartRedis(t), NATS: testutil.StartNATS(t, func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "delayd", Password: "d", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{"orders.>", "$SRV.>", "delayd.>", "_INBOX.>"}},
			}},
			{Username: "app", Password: "a"},
		}
	})}
	c := e.Config()
	c.NATS.User, c.NATS.Password = "delayd", "d"
	c.Scanner.MaxAttempts = 2
	c.Scanner.RetryBackoff = 50 * time.Millisecond
	return e, c
}

// Found in review: after an attempt whose flush was not confirmed the
// envelope waits for its retry in due, and a cancel then said nothing of
// the attempt that may still arrive.
func TestCancelAfterUnconfirmedAttemptSaysInFlight(t *testing.T) {
	t.Parallel()
	e, proxy, c := natsBehindProxy(t)
	c.Scanner.RetryBackoff = 30 * time.Second
	// The 2 s round trip below is slow, not silent: it ends after the
	// flush's deadline (half the lease) but within a quarter lease more,
	// and before 3 pings (a quarter ttl apart) go unanswered. Fire and
	// forget: no stream list read before the batch, over the same path.
	c.Scanner.Lease, c.Ownership.TTL = 3600*time.Millisecond, 10*time.Second
	c.Targets.FireAndForget = []string{"slow.cancel"}
	e.StartDaemon(c)
	waitOwned(t, e.InspectStore(c)) // the shards held before the path slows
	nc := e.Conn()
	defer nc.Close()
	daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "slow.cancel", "Delayd-Delay", "1s", "Delayd-Id", "sc"))
	proxy.Set(testutil.Up, testutil.Fault{Latency: 2 * time.Second})
	st := e.InspectStore(c)
	// Attempt 1 made, unconfirmed, waiting for its retry.
	waitEntry(t, st, "sc", 10*time.Second, "released pending after an unconfirmed attempt 1", func(en store.Entry) bool {
		return en.State == store.StatePending && en.Attempts == 1
	})
	proxy.Clear()
	m := nats.NewMsg("delayd.cancel")
	m.Header.Set("Delayd-Id", "sc")
	rep, err := nc.RequestMsg(m, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Cancelled bool `json:"cancelled"`
		InFlight  bool `json:"in_flight"`
	}
	if err := json.Unmarshal(rep.Data, &r); err != nil || !r.Cancelled || !r.InFlight {
		t.Fatalf("cancel after an unconfirmed attempt: %s %v; want cancelled and in_flight", rep.Data, err)
	}
}

// Found in review: a JetStream target the server refuses got no PubAck and
// held the publish stage until its deadline; it must fail at once with the
// permissions error, like a core one.
func TestRefusedJetStreamTargetFailsWithTheRefusal(t *testing.T) {
	t.Parallel()
	e, c := refusingNATS(t)
	c.Targets.JetStream = []string{"payments.>"}
	runDaemon(t, c)
	app, err := nats.Connect(e.NATS.URL(), nats.UserInfo("app", "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	daemontest.ScheduleServed(t, app, daemontest.Hdr("Delayd-Target", "payments.js", "Delayd-Delay", "100ms", "Delayd-Id", "rj"))
	d := waitState(t, e.InspectStore(c), "rj", store.StateDead, 15*time.Second)
	if !strings.Contains(d.Error, "ermissions") {
		t.Fatalf("dead with %q, want the permissions violation (not a PubAck timeout)", d.Error)
	}
}
