package systest

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// A consumer that subscribes 5 s after its timers fell due (a deployment
// restarting, a consumer reconnecting late) gets every one: the core
// deliveries that reached no subscriber were retried with backoff, not
// counted delivered and deleted. Before the interest check, all were lost.
func TestLateConsumerGetsEveryTimer(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Scanner.RetryBackoff = 100 * time.Millisecond
	c.Scanner.RetryBackoffMax = time.Second
	c.Scanner.MaxAttempts = 3 // 0.3 s of tries: not enough alone
	c.Scanner.NoInterestRetryFor = 30 * time.Second
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	const n = 200
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "late-" + strconv.Itoa(i)
		daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "late.consumer", "Delayd-Delay", "500ms", "Delayd-Id", ids[i]))
	}
	due := time.Now().Add(500 * time.Millisecond)
	time.Sleep(time.Until(due.Add(5 * time.Second)))
	consumer := e.Conn()
	defer consumer.Close()
	got := e.Sink(consumer, "late.consumer")
	if have := got.WaitCount(n, 15*time.Second); have < n {
		t.Errorf("%d of %d delivered once the consumer subscribed", have, n)
	}
	got.Check(t, ids)
	for _, id := range ids[:1] {
		if ds := got.Get(id); len(ds) > 0 && ds[0].Attempt < 2 {
			t.Errorf("%s arrived as attempt %d: its tries while nobody listened were not counted", id, ds[0].Attempt)
		}
	}
	waitGone(t, e, c)
}

// A NATS restart: delayd reconnects within a second and publishes what
// fell due meanwhile, but the consumer (reconnect wait 5 s) is not back
// yet. Those deliveries reach no subscriber and are retried until it is:
// 0 lost (the issue measured 18 of 18 lost for a 20 s restart).
func TestNATSRestartConsumerReconnectsLater(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Scanner.RetryBackoff = 100 * time.Millisecond
	c.Scanner.RetryBackoffMax = time.Second
	c.Scanner.MaxAttempts = 3
	c.Scanner.NoInterestRetryFor = 30 * time.Second
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	consumer, err := nats.Connect(e.NATS.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(5*time.Second),
		nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	got := e.Sink(consumer, "restart.consumer")
	const n = 100
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "restart-" + strconv.Itoa(i)
		daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "restart.consumer", "Delayd-Delay", "1s", "Delayd-Id", ids[i]))
	}
	e.NATS.Stop()
	time.Sleep(1500 * time.Millisecond) // every timer falls due while NATS is down
	e.NATS.Start()
	if have := got.WaitCount(n, 20*time.Second); have < n {
		t.Errorf("%d of %d delivered after the restart", have, n)
	}
	got.Check(t, ids)
	retried := 0
	for _, id := range ids {
		if ds := got.Get(id); len(ds) > 0 && ds[0].Attempt > 1 {
			retried++
		}
	}
	if retried == 0 {
		t.Error("no delivery was retried: the consumer was back before delayd published, the test proves nothing")
	}
	waitGone(t, e, c)
}

// A subject nobody ever subscribes to: its envelope is retried for
// scanner.no_interest_retry_for by the backoff schedule, then dead, each
// try counted as no_interest; a fire-and-forget target is delivered (and
// deleted) whoever listens.
func TestNoSubscriberReachesDeadSet(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Scanner.RetryBackoff = 50 * time.Millisecond
	c.Scanner.RetryBackoffMax = 200 * time.Millisecond
	c.Scanner.MaxAttempts = 3
	// Tries at 0, 50, 150, 350, 550, 750, 950 and 1150 ms: the 8th is the
	// first at or after 1 s (scanner's TestNoInterestBudget).
	c.Scanner.NoInterestRetryFor = time.Second
	const tries = 8
	c.Targets.FireAndForget = []string{"signal.>"}
	c.HTTP.SampleInterval = 100 * time.Millisecond
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "nobody.listens", "Delayd-Delay", "100ms", "Delayd-Id", "nobody"))
	due := time.Now().Add(100 * time.Millisecond)
	daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "signal.nobody", "Delayd-Delay", "100ms", "Delayd-Id", "signal"))
	st := e.InspectStore(c)
	dead := waitState(t, st, "nobody", store.StateDead, 20*time.Second)
	took := time.Since(due)
	if dead.Attempts != tries {
		t.Errorf("dead after %d tries, want %d", dead.Attempts, tries)
	}
	if took < 1150*time.Millisecond {
		t.Errorf("dead %s after it was due, before its last try (1.15 s)", took)
	}
	if !strings.Contains(dead.Error, "no subscriber") {
		t.Errorf("dead with error %q, want the no-subscriber one", dead.Error)
	}
	if en, err := st.Get(t.Context(), "signal"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the fire-and-forget envelope is still stored: %+v (%v)", en, err)
	}
	_, body := daemontest.HTTPGet(t, "http://"+c.HTTP.Addr+"/metrics")
	for name, want := range map[string]float64{
		`delayd_envelopes_delivered_total{result="no_interest"}`: tries,
		`delayd_envelopes_delivered_total{result="ok"}`:          1,
		`delayd_envelopes_delivered_total{result="failed"}`:      0,
	} {
		if v, ok := daemontest.Metric(body, name); !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
		}
	}
}

// waitGone waits until nothing is stored under the config's namespace:
// every envelope delivered and acknowledged.
func waitGone(t *testing.T, e *daemontest.Env, c config.Config) {
	t.Helper()
	if !testutil.Eventually(10*time.Second, func() bool { return e.Stored(c) == 0 }) {
		t.Fatalf("%d envelopes still stored", e.Stored(c))
	}
}

// A consumer away for 30 s (a deployment rolled out slowly) while its
// timers fall due, with the default backoff and budget: it gets every one
// once it is back, at most one backoff step (here 16 s) later.
func TestConsumerAway30s(t *testing.T) {
	daemontest.Soak(t, "a consumer away for 30 s")
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Scanner.RetryBackoff, c.Scanner.RetryBackoffMax = time.Second, time.Minute // the defaults
	c.HTTP.Addr = ""
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	consumer := e.Conn()
	defer consumer.Close()
	sub, err := consumer.SubscribeSync("away.consumer")
	if err != nil {
		t.Fatal(err)
	}
	_ = consumer.Flush()
	_ = sub.Unsubscribe() // away from now on
	const n = 100
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "away-" + strconv.Itoa(i)
		daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "away.consumer", "Delayd-Delay", "1s", "Delayd-Id", ids[i]))
	}
	time.Sleep(31 * time.Second)
	got := e.Sink(consumer, "away.consumer")
	if have := got.WaitCount(n, 40*time.Second); have < n {
		t.Fatalf("%d of %d delivered after the consumer came back", have, n)
	}
	got.Check(t, ids)
}
