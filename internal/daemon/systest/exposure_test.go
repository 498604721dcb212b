package systest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// The tests in this file are the cases of issue 11's "Why", each found by
// trying the defaults as an attacker would. They use only the wire
// protocol and HTTP, so each one failed on the code before the fix.

// TestProbeListenerServesNoConsole: the pod-facing listener (http.addr)
// serves probes and metrics only; a stored Authorization header and a card
// number in a payload are not reachable through it.
func TestProbeListenerServesNoConsole(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.UI.Addr = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	e.StartDaemon(c)
	e.WaitReady(c)
	nc := e.Conn()
	defer nc.Close()
	h := daemontest.Hdr("Delayd-Target", "orders.cancel", "Delayd-Delay", "1h", "Delayd-Id", "secret-1", "Authorization", "Bearer s3cret-token")
	rep, err := daemontest.Schedule(nc, "delayd", h, "card 4111111111111111")
	if err != nil || rep.Header.Get(micro.ErrorHeader) != "" {
		t.Fatalf("schedule: %v %v", err, rep.Header)
	}
	base := "http://" + c.HTTP.Addr
	for _, path := range []string{"/ui/api/envelope?id=secret-1", "/ui/", "/ui/api/list", "/ui/api/overview", "/ui/api/flow"} {
		code, body := daemontest.HTTPGet(t, base+path)
		if code != 404 {
			t.Errorf("GET %s on http.addr: %d, want 404", path, code)
		}
		if strings.Contains(body, "s3cret") || strings.Contains(body, "4111") {
			t.Errorf("GET %s on http.addr leaks a secret: %s", path, body)
		}
	}
	for _, path := range []string{"/livez", "/readyz", "/metrics"} {
		if code, _ := daemontest.HTTPGet(t, base+path); code != 200 {
			t.Errorf("GET %s on http.addr: %d, want 200", path, code)
		}
	}
	// The console is on ui.addr, loopback, and even there shows neither
	// the payload nor the credentials by default.
	code, body := daemontest.HTTPGet(t, "http://"+c.UI.Addr+"/ui/api/envelope?id=secret-1")
	if code != 200 || !strings.Contains(body, "Authorization") || strings.Contains(body, "s3cret") || strings.Contains(body, "4111") {
		t.Errorf("GET /ui/api/envelope on ui.addr: %d %s", code, body)
	}
	// The console is wired to the daemon's flow control.
	if code, body := daemontest.HTTPGet(t, "http://"+c.UI.Addr+"/ui/api/flow"); code != 200 || !strings.Contains(body, `"available":true`) {
		t.Errorf("GET /ui/api/flow on ui.addr: %d %s", code, body)
	}
}

// TestMQTTRetainedMessageRefused: with MQTT enabled, a delayed message to
// $MQTT.rmsgs would plant a forged retained message for every new MQTT
// subscriber. It is refused with 403 and never stored.
func TestMQTTRetainedMessageRefused(t *testing.T) {
	t.Parallel()
	e := &daemontest.Env{T: t, Redis: testutil.StartRedis(t), NATS: testutil.StartNATS(t, func(o *server.Options) {
		o.ServerName = "mqtt-test" // MQTT requires a server name
		o.MQTT.Host, o.MQTT.Port = "127.0.0.1", testutil.FreePort(t)
	})}
	c := e.Config()
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	refusedTargets(t, e, c, nc, `{"topic":"a","msg":"forged"}`, "$MQTT.rmsgs", "$MQTT.rmsgs.forged", "$MQTT.sess.abc", "$MQTT.JSA.x.RM.y")
}

// refusedTargets schedules payload to each target and wants 403 for each,
// and nothing stored.
func refusedTargets(t *testing.T, e *daemontest.Env, c config.Config, nc *nats.Conn, payload string, targets ...string) {
	t.Helper()
	for _, target := range targets {
		rep, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", target, "Delayd-Delay", "10ms"), payload)
		if err != nil {
			t.Fatal(err)
		}
		if code := rep.Header.Get(micro.ErrorCodeHeader); code != "403" {
			t.Errorf("target %s: code %q, want 403", target, code)
		}
	}
	if n := e.Stored(c); n != 0 {
		t.Fatalf("%d envelopes stored", n)
	}
}

// TestOperatorEndpointsLeftThePublisherSpace: get, list, stats, replay and
// purge no longer answer next to schedule and cancel, and wake-ups are not
// under the publisher prefix either, so a publisher's permissions on
// delayd.schedule/delayd.cancel (or, carelessly, delayd.>) reach neither.
func TestOperatorEndpointsLeftThePublisherSpace(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	for _, verb := range []string{"get", "list", "stats", "replay", "purge"} {
		m := nats.NewMsg("delayd." + verb)
		m.Header.Set("Delayd-Id", "x")
		m.Data = []byte(`{"all":true}`)
		if _, err := nc.RequestMsg(m, 5*time.Second); !errors.Is(err, nats.ErrNoResponders) {
			t.Errorf("delayd.%s: %v, want no responders", verb, err)
		}
	}
	subs, err := e.NATS.Srv.Subsz(&server.SubszOptions{Subscriptions: true, Test: "delayd.wake.1"})
	if err != nil {
		t.Fatal(err)
	}
	if subs.Total != 0 {
		t.Errorf("%d subscriptions listen for wake-ups on delayd.wake.1", subs.Total)
	}
}

// TestDeadLetterCarriesNoMsgID: the dead-letter copy of an envelope whose
// JetStream delivery failed must not carry delayd's Nats-Msg-Id (it would
// be dropped as a duplicate, or forge one, in a stream on the dead subject).
func TestDeadLetterCarriesNoMsgID(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Targets.JetStream = []string{"nostream.>"}
	c.Scanner.MaxAttempts = 1
	c.Dead.Publish = true
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	got := make(chan *nats.Msg, 1)
	if _, err := nc.Subscribe("delayd.dead.>", func(m *nats.Msg) { got <- m }); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	rep, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "nostream.orders", "Delayd-Delay", "10ms", "Delayd-Id", "dl-1", "traceparent", "00-abc-01"), "x")
	if err != nil || rep.Header.Get(micro.ErrorHeader) != "" {
		t.Fatalf("schedule: %v %v", err, rep.Header)
	}
	var m *nats.Msg
	select {
	case m = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("no dead letter published")
	}
	if id := m.Header.Get("Nats-Msg-Id"); id != "" {
		t.Errorf("dead letter carries Nats-Msg-Id %q", id)
	}
	if m.Header.Get("traceparent") != "00-abc-01" || m.Header.Get("Delayd-Error") == "" {
		t.Errorf("dead letter headers: %v", m.Header)
	}
}
