package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/daemon"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/testutil"
)

// Envelopes published to delayd.intake while every delayd is down are
// held by the stream (its PubAck is the promise) and delivered once each,
// never early, after a delayd starts.
func TestStreamIntakeWhileDaemonAway(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.cfg()
	_ = e.startDaemon(c)() // creates the stream; then no delayd runs
	nc := e.conn()
	defer nc.Close()
	sink := e.sink(nc, "orders.due")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const n = 500
	at := time.Now().Add(1500 * time.Millisecond).UTC().Format(time.RFC3339Nano)
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprint("away-", i)
		m := &nats.Msg{Subject: "delayd.intake", Data: []byte("x"), Header: hdr(envelope.HeaderTarget, "orders.due",
			envelope.HeaderAt, at, envelope.HeaderID, ids[i])}
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	e.startDaemon(c)
	if got := sink.waitCount(n, 30*time.Second); got < n {
		t.Fatalf("%d of %d delivered", got, n)
	}
	quiet(t, e, c, sink) // room for a duplicate to show
	if _, dups := sink.check(t, ids); dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
}

// Without JetStream delayd starts with a warning and the request intake
// works; with intake.stream.enabled: true it refuses to run.
func TestStreamIntakeWithoutJetStream(t *testing.T) {
	t.Parallel()
	e := &env{t: t, redis: testutil.StartRedis(t), nats: testutil.StartNATS(t, func(o *server.Options) { o.JetStream = false })}
	c := e.cfg()
	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- daemon.New(c, hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})).Run(ctx)
	}()
	nc := e.conn()
	defer nc.Close()
	scheduleServed(t, nc, hdr(envelope.HeaderTarget, "orders.x", envelope.HeaderDelay, "1h"))
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "has no JetStream") {
		if time.Now().After(deadline) {
			t.Fatalf("no warning about JetStream:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
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

// The quick start's embedded server has JetStream: the stream intake works
// with --embedded.
func TestStreamIntakeEmbedded(t *testing.T) {
	t.Parallel()
	url := fmt.Sprintf("nats://127.0.0.1:%d", testutil.FreePort(t))
	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"delayd", "run", "--embedded", "--nats-url", url, "--set", "http.addr=127.0.0.1:0",
			"--set", "ui.addr=127.0.0.1:0"}, func(string) string { return "" }, &logs, &logs)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "stream intake serving") {
		if time.Now().After(deadline) {
			t.Fatalf("stream intake not serving:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	got := make(chan *nats.Msg, 1)
	if _, err := nc.ChanSubscribe("embedded.stream", got); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	if _, err := js.PublishMsg(context.Background(), &nats.Msg{Subject: "delayd.intake", Data: []byte("hi"),
		Header: hdr(envelope.HeaderTarget, "embedded.stream", envelope.HeaderDelay, "100ms")}); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if string(m.Data) != "hi" || !strings.HasPrefix(m.Header.Get(envelope.HeaderID), "s-") {
			t.Fatalf("delivered %q %v", m.Data, m.Header)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("not delivered:\n%s", logs.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
