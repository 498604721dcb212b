package systest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
	"github.com/delayd/delayd/internal/testutil"
)

// Envelopes published to delayd.intake while every delayd is down are
// held by the stream (its PubAck is the promise) and delivered once each,
// never early, after a delayd starts.
func TestStreamIntakeWhileDaemonAway(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	_ = e.StartDaemon(c)() // creates the stream; then no delayd runs
	nc := e.Conn()
	defer nc.Close()
	sink := e.Sink(nc, "orders.due")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const n = 500
	at := time.Now().Add(1500 * time.Millisecond).UTC().Format(time.RFC3339Nano)
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprint("away-", i)
		m := &nats.Msg{Subject: "delayd.intake", Data: []byte("x"), Header: daemontest.Hdr(envelope.HeaderTarget, "orders.due",
			envelope.HeaderAt, at, envelope.HeaderID, ids[i])}
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	e.StartDaemon(c)
	if got := sink.WaitCount(n, 30*time.Second); got < n {
		t.Fatalf("%d of %d delivered", got, n)
	}
	daemontest.Quiet(t, e, c, sink) // room for a duplicate to show
	if _, dups := sink.Check(t, ids); dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
}

// Without JetStream delayd starts with a warning and the request intake
// works; with intake.stream.enabled: true it refuses to run.
func TestStreamIntakeWithoutJetStream(t *testing.T) {
	t.Parallel()
	e := &daemontest.Env{T: t, Redis: testutil.StartRedis(t), NATS: testutil.StartNATS(t, func(o *server.Options) { o.JetStream = false })}
	c := e.Config()
	var logs testutil.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- daemon.New(c, hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})).Run(ctx)
	}()
	nc := e.Conn()
	defer nc.Close()
	daemontest.ScheduleServed(t, nc, daemontest.Hdr(envelope.HeaderTarget, "orders.x", envelope.HeaderDelay, "1h"))
	if !testutil.Eventually(10*time.Second, func() bool { return strings.Contains(logs.String(), "has no JetStream") }) {
		t.Fatalf("no warning about JetStream:\n%s", logs.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	c.Intake.Stream.Enabled = "true"
	c.HTTP.Addr = "127.0.0.1:0"
	err := daemon.New(c, hclog.NewNullLogger()).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no JetStream") {
		t.Fatalf("required stream intake without JetStream: %v", err)
	}
}

// TestStreamIntakeSourcedAndRepublished: an operator's intake stream that
// sources another stream, and one that captures a stream's republished
// messages, gets headers nats-server stamps (Nats-Stream-Source; Nats-Stream,
// Nats-Subject, Nats-Sequence, Nats-Time-Stamp, Nats-Last-Sequence).
// delayd stores and delivers those envelopes, without the stamped headers
// and with the publisher's own. Before, it refused the stamped Nats-*
// header with 400 and sent the envelope to delayd.rejected, after the
// publisher had its PubAck. A publisher's own Nats-* header on the
// request intake is still refused.
func TestStreamIntakeSourcedAndRepublished(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	nc := e.Conn()
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORIGIN", Subjects: []string{"orders.delayed.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "REPUB", Subjects: []string{"rp.src.>"},
		RePublish: &jetstream.RePublish{Source: "rp.src.>", Destination: "delayd.intake.rp.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DELAYD_INTAKE", Subjects: []string{"delayd.intake", "delayd.intake.>"},
		Retention: jetstream.WorkQueuePolicy, Sources: []*jetstream.StreamSource{{Name: "ORIGIN"}}}); err != nil {
		t.Fatal(err)
	}
	c := e.Config()
	// The source runs before anything is published to ORIGIN: a message
	// published while nats-server was still setting the source up was not
	// sourced in three runs of this test (the intake stream's source said
	// lag 0 with ORIGIN holding it), with or without delayd.
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "orders.delayed.warmup", Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	intake, err := js.Stream(ctx, "DELAYD_INTAKE")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Wait(t, 10*time.Second, "the intake stream sources ORIGIN's warm-up message", func() bool {
		info, err := intake.Info(ctx)
		return err == nil && info.State.Msgs == 1
	})
	if err := intake.DeleteMsg(ctx, 1); err != nil {
		t.Fatal(err)
	}
	e.StartDaemon(c)
	sink := e.Sink(nc, "orders.due")
	rejected := e.Sink(nc, "delayd.rejected")
	for _, subj := range []string{"orders.delayed.x", "rp.src.x"} {
		m := &nats.Msg{Subject: subj, Data: []byte("x"), Header: daemontest.Hdr(envelope.HeaderTarget, "orders.due",
			envelope.HeaderDelay, "50ms", envelope.HeaderID, subj, "X-Trace", "t-"+subj)}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatalf("publish to %s: %v", subj, err)
		}
	}
	if got := sink.WaitCount(2, 20*time.Second); got != 2 {
		var why []string
		for _, r := range rejected.All() {
			why = append(why, r[0].Header.Get(envelope.HeaderError))
		}
		info, _ := intake.Info(ctx)
		b, _ := json.Marshal(info)
		t.Fatalf("%d of 2 delivered (sourced %d, republished %d); rejected: %v; intake stream: %s", got, len(sink.Get("orders.delayed.x")), len(sink.Get("rp.src.x")), why, b)
	}
	for _, id := range []string{"orders.delayed.x", "rp.src.x"} {
		d := sink.Get(id)
		if len(d) != 1 {
			t.Fatalf("%s delivered %d times", id, len(d))
		}
		for k := range d[0].Header {
			if envelope.IsNATSHeader(k) {
				t.Errorf("%s delivered with the stamped header %s: %v", id, k, d[0].Header)
			}
		}
		if d[0].Header.Get("X-Trace") != "t-"+id {
			t.Errorf("%s lost the publisher's header: %v", id, d[0].Header)
		}
	}
	// The request intake still refuses a publisher's Nats-* header, a
	// stamped name included.
	rep, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr(envelope.HeaderTarget, "orders.due", envelope.HeaderDelay, "1s",
		"Nats-Stream-Source", "ORIGIN 1 > > orders.delayed.x"), "x")
	if err != nil || rep.Header.Get("Nats-Service-Error-Code") != "400" {
		t.Errorf("a publisher's Nats-Stream-Source on delayd.schedule: want 400, got %v %v", err, rep.Header)
	}
}

// TestScheduleThroughServiceImport: a publisher in another account that
// imports delayd's schedule service schedules like any other. nats-server
// stamps Nats-Request-Info on every request that crosses the import, and
// delayd refused each with 400 ("header "Nats-Request-Info" is refused").
// The stamp is dropped, not delivered.
func TestScheduleThroughServiceImport(t *testing.T) {
	t.Parallel()
	conf := filepath.Join(t.TempDir(), "accounts.conf")
	if err := os.WriteFile(conf, []byte(`accounts: {
  D: {users: [{user: d, password: d}], jetstream: enabled, exports: [{service: "delayd.schedule"}]}
  P: {users: [{user: p, password: p}], imports: [{service: {account: D, subject: "delayd.schedule"}}]}
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	fo, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	n := testutil.StartNATS(t, func(o *server.Options) { o.Accounts, o.Users = fo.Accounts, fo.Users })
	e := &daemontest.Env{T: t, Redis: testutil.StartRedis(t), NATS: n}
	c := e.Config()
	c.NATS.User, c.NATS.Password = "d", "d"
	runDaemon(t, c)
	dc, err := nats.Connect(n.URL(), nats.UserInfo("d", "d"))
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	daemontest.WaitService(t, strings.Replace(n.URL(), "nats://", "nats://d:d@", 1), c.Subject)
	sink := e.Sink(dc, "imp.due")
	pc, err := nats.Connect(n.URL(), nats.UserInfo("p", "p"))
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	rep, err := daemontest.Schedule(pc, "delayd", daemontest.Hdr(envelope.HeaderTarget, "imp.due", envelope.HeaderDelay, "50ms", envelope.HeaderID, "imp-1"), "x")
	if err != nil || rep.Header.Get("Nats-Service-Error") != "" {
		t.Fatalf("schedule through the import: %v %v", err, rep.Header)
	}
	if sink.WaitCount(1, 10*time.Second) != 1 {
		t.Fatal("not delivered")
	}
	if h := sink.Get("imp-1")[0].Header; h.Get("Nats-Request-Info") != "" {
		t.Errorf("the import's stamp was delivered: %v", h)
	}
}
