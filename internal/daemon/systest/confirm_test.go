package systest

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/daemon"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// A core target captured by a stream that refuses (CAP on cap.>, max_msgs
// 2, discard new) and no core subscriber: of 4 envelopes, the stream keeps
// 2, and the other 2 are retried and dead-lettered with the stream's
// error. Before, delayd counted all 4 delivered and deleted them.
func TestStreamRefusalNotDelivered(t *testing.T) {
	t.Parallel()
	streamRefusals(t, daemontest.NewEnv(t), "cap.>", "cap.x")
}

// The same through a subject mapping of the account (capm.x → capm.y, the
// stream on capm.y): the stream's listed subjects do not match the
// target, so before, the delivery was not awaited; the stream's refusal
// came after the batch was confirmed and taught delayd nothing: the
// stream kept 2, delayd counted 4 delivered, 2 were lost, and the log
// said "a stream refused a core delivery after its batch was confirmed".
func TestStreamRefusalThroughMapping(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	if err := e.NATS.Srv.GlobalAccount().AddMapping("capm.x", "capm.y"); err != nil {
		t.Fatal(err)
	}
	streamRefusals(t, e, "capm.y", "capm.x")
}

// streamRefusals schedules 4 envelopes to target, captured by a stream
// on subject with max_msgs 2 and discard new: 2 must end in the stream
// and 2 dead with the stream's error, none lost.
func streamRefusals(t *testing.T, e *daemontest.Env, subject, target string) {
	c := e.Config()
	c.Scanner.RetryBackoff = 50 * time.Millisecond
	c.Scanner.RetryBackoffMax = 200 * time.Millisecond
	c.Scanner.MaxAttempts = 3
	nc := e.Conn()
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "CAP", Subjects: []string{subject}, MaxMsgs: 2, Discard: jetstream.DiscardNew})
	if err != nil {
		t.Fatal(err)
	}
	e.StartDaemon(c)
	ids := []string{"cap-0", "cap-1", "cap-2", "cap-3"}
	// One due time: one batch, the first deliveries to the target.
	at := time.Now().Add(time.Second).UTC().Format(time.RFC3339Nano)
	for _, id := range ids {
		daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", target, "Delayd-At", at, "Delayd-Id", id))
	}
	st := e.InspectStore(c)
	// Every envelope ends in the stream or in the dead set, and none in
	// both: nothing is stored any more once each is settled.
	var inStream map[string]bool
	var dead []store.Entry
	if !testutil.Eventually(20*time.Second, func() bool {
		// Redis first: an envelope gone from it was confirmed, so the
		// stream had it before; read after, it is in the stream read.
		settled, gone := true, map[string]bool{}
		dead = nil
		for _, id := range ids {
			en, err := st.Get(ctx, id)
			switch {
			case errors.Is(err, store.ErrNotFound):
				gone[id] = true
			case err != nil:
				t.Fatal(err)
			case en.State == store.StateDead:
				dead = append(dead, en)
			default:
				settled = false
			}
		}
		inStream = map[string]bool{}
		cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n := int(info.State.Msgs); n > 0 {
			batch, err := cons.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			for m := range batch.Messages() {
				inStream[m.Headers().Get(envelope.HeaderID)] = true
			}
		}
		for id := range gone {
			if !inStream[id] {
				t.Fatalf("%s is gone from Redis but not in the stream: counted delivered, and lost", id)
			}
		}
		return settled
	}) {
		t.Fatalf("not settled: in the stream %v, dead %d", inStream, len(dead))
	}
	if len(inStream) != 2 || len(dead) != 2 {
		t.Fatalf("in the stream %v, dead %+v: want 2 and 2", inStream, dead)
	}
	for _, en := range dead {
		if inStream[en.ID] {
			t.Errorf("%s is both in the stream and dead", en.ID)
		}
		if en.Attempts != c.Scanner.MaxAttempts || !strings.Contains(en.Error, "maximum messages exceeded") {
			t.Errorf("%s: dead after %d attempts with %q, want %d attempts and the stream's error", en.ID, en.Attempts, en.Error, c.Scanner.MaxAttempts)
		}
	}
}

// A daemon whose NATS user may not subscribe to its inbox cannot hear that
// a delivery reached no one: it is not ready, with the server's refusal in
// /readyz and in the log, holds no shard, and delivers nothing (a due
// envelope stays stored). Once the operator grants the subscription (a
// config reload of nats-server), it becomes ready and delivers, with the
// interest check on. Before, it stayed ready, logged one error, and
// counted every delivery delivered, heard or not.
func TestDaemonDeniedItsInbox(t *testing.T) {
	t.Parallel()
	users := func(inbox bool) []*server.User {
		sub := []string{"delayd.>", "$SRV.>"}
		if inbox {
			sub = append(sub, "_INBOX_delayd.>")
		}
		return []*server.User{
			{Username: "delayd", Password: "d", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{"orders.>", "delayd.>", "$JS.API.>", "$SRV.>"}},
				Subscribe: &server.SubjectPermission{Allow: sub},
				Response:  &server.ResponsePermission{MaxMsgs: 1, Expires: time.Minute},
			}},
			{Username: "app", Password: "a"},
		}
	}
	e := &daemontest.Env{T: t, Redis: testutil.StartRedis(t), NATS: testutil.StartNATS(t, func(o *server.Options) { o.Users = users(false) })}
	c := e.Config()
	c.NATS.User, c.NATS.Password, c.NATS.InboxPrefix = "delayd", "d", "_INBOX_delayd"
	c.Scanner.RetryBackoff = 50 * time.Millisecond
	c.Scanner.RetryBackoffMax = 100 * time.Millisecond
	c.Scanner.MaxAttempts = 2
	c.Scanner.NoInterestRetryFor = 300 * time.Millisecond
	var logs testutil.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- daemon.New(c, hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Debug})).Run(ctx)
	}()
	app, err := nats.Connect(e.NATS.URL(), nats.UserInfo("app", "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	daemontest.ScheduleServed(t, app, daemontest.Hdr("Delayd-Target", "orders.nobody", "Delayd-Delay", "10ms", "Delayd-Id", "unheard"))

	readyz := "http://" + c.HTTP.Addr + "/readyz"
	var code int
	var body string
	if !testutil.Eventually(15*time.Second, func() bool {
		code, body = daemontest.HTTPGet(t, readyz)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "Permissions Violation for Subscription to")
	}) {
		t.Fatalf("/readyz with the inbox refused: %d %q, want 503 with the refusal", code, body)
	}
	if !strings.Contains(logs.String(), "cannot receive on the delivery inbox") {
		t.Errorf("the log does not say it cannot receive on its inbox:\n%s", logs.String())
	}
	_, body = daemontest.HTTPGet(t, "http://"+c.HTTP.Addr+"/metrics")
	if v, ok := daemontest.Metric(body, "delayd_shards_owned"); !ok || v != 0 {
		t.Errorf("delayd_shards_owned = %v (present %v), want 0", v, ok)
	}
	st := e.InspectStore(c)
	if en, err := st.Get(ctx, "unheard"); err != nil || en.State != store.StatePending || en.Attempts != 0 {
		t.Fatalf("the due envelope while the inbox is refused: %+v (%v), want pending, never tried", en, err)
	}

	// The operator grants the subscription.
	opts := e.NATS.Opts.Clone()
	opts.Users = users(true)
	if err := e.NATS.Srv.ReloadOptions(opts); err != nil {
		t.Fatal(err)
	}
	e.NATS.Opts = opts
	if !testutil.Eventually(15*time.Second, func() bool {
		code, body = daemontest.HTTPGet(t, readyz)
		return code == http.StatusOK
	}) {
		t.Fatalf("/readyz once the inbox is granted: %d %q", code, body)
	}
	// The interest check works: nobody listens, so the envelope is tried
	// and goes dead as "no subscriber", never counted delivered.
	dead := waitState(t, st, "unheard", store.StateDead, 20*time.Second)
	if !strings.Contains(dead.Error, "no subscriber") {
		t.Errorf("dead with %q, want no subscriber", dead.Error)
	}
	got := e.Sink(app, "orders.>")
	daemontest.ScheduleServed(t, app, daemontest.Hdr("Delayd-Target", "orders.heard", "Delayd-Delay", "10ms", "Delayd-Id", "heard"))
	got.WaitIDs([]string{"heard"}, 10*time.Second)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestDeliversBesideAWildcardSubscriber: an operator runs `nats sub '>'`
// on a server without JetStream. The inbox self-check once relied on the
// server's no-responders status for its probes ($JS.API.INFO and
// <prefix>.internal.probe); a `>` subscriber suppresses that status and
// never answers, so the daemon stayed not ready ("no probe came back on
// its inbox ... no reason given by the server"), held no shard and
// delivered nothing. The daemon now answers its own probe.
func TestDeliversBesideAWildcardSubscriber(t *testing.T) {
	t.Parallel()
	e := &daemontest.Env{T: t, Redis: testutil.StartRedis(t), NATS: testutil.StartNATS(t, func(o *server.Options) { o.JetStream = false })}
	watcher := e.Conn()
	defer watcher.Close()
	if _, err := watcher.Subscribe(">", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := watcher.Flush(); err != nil {
		t.Fatal(err)
	}
	c := e.Config()
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	got := e.Sink(nc, "wild.x")
	if _, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "wild.x", "Delayd-Delay", "10ms", "Delayd-Id", "w1"), "hi"); err != nil {
		t.Fatal(err)
	}
	got.WaitIDs([]string{"w1"}, 15*time.Second)
	if len(got.Get("w1")) == 0 {
		_, body := daemontest.HTTPGet(t, "http://"+c.HTTP.Addr+"/readyz")
		t.Fatalf("not delivered beside a '>' subscriber; /readyz: %q", body)
	}
	readyz := "http://" + c.HTTP.Addr + "/readyz"
	if code, body := daemontest.HTTPGet(t, readyz); code != http.StatusOK {
		t.Fatalf("/readyz beside a '>' subscriber: %d %q", code, body)
	}
}
