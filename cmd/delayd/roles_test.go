package main

import (
	"bytes"
	"context"
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
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/internal/daemon"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// docPermissions returns the NATS authorization block docs/security.md
// documents, so that the test runs exactly what users copy.
func docPermissions(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "<!-- permissions:begin")
	block, _, ok2 := strings.Cut(rest, "<!-- permissions:end -->")
	if !ok || !ok2 {
		t.Fatal("docs/security.md has no permissions block")
	}
	_, block, _ = strings.Cut(block, "```\n")
	block, _, _ = strings.Cut(block, "```")
	return block
}

// permissionEnv is a Redis and a nats-server with the users of the
// permission block in docs/security.md; each user's password is its
// name's start and "-pw" (pub-pw, op-pw, con-pw, delayd-pw, mig-pw).
func permissionEnv(t *testing.T) *daemontest.Env {
	t.Helper()
	dir := t.TempDir()
	port := testutil.FreePort(t)
	conf := fmt.Sprintf("PUBLISHER_PASSWORD: pub-pw\nOPERATOR_PASSWORD: op-pw\nCONSUMER_PASSWORD: con-pw\nDELAYD_PASSWORD: delayd-pw\n"+
		"MIGRATOR_PASSWORD: mig-pw\n"+
		"listen: 127.0.0.1:%d\njetstream { store_dir: %q }\n%s", port, filepath.Join(dir, "js"), docPermissions(t))
	path := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("docs/security.md permissions do not load: %v\n%s", err, conf)
	}
	e := &daemontest.Env{T: t, Redis: testutil.StartRedis(t), NATS: testutil.StartNATS(t, func(o *server.Options) {
		opts.NoLog, opts.NoSigs = o.NoLog, true
		*o = *opts
	})}
	return e
}

// TestPermissionBlocks runs a real nats-server with the users of the
// permission block in docs/security.md. The publisher can schedule and
// cancel but cannot read, replay, purge or send wake-ups; the operator can
// inspect and repair with the CLI and find the service as `nats micro ls`
// does; the daemon delivers.
func TestPermissionBlocks(t *testing.T) {
	t.Parallel()
	e := permissionEnv(t)
	c := e.Config()
	c.NATS.User, c.NATS.Password, c.NATS.InboxPrefix = "delayd", "delayd-pw", "_INBOX_delayd"
	c.Targets.Allow = []string{"orders.>", "notifications.>"}
	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// An intake-only and a scanner-only daemon, so that wake-ups cross
	// between daemons under the daemon block too.
	done := make(chan error, 2)
	for _, mode := range []string{"intake", "scanner"} {
		c := c
		c.Mode, c.HTTP.Addr = mode, "127.0.0.1:0"
		go func() {
			done <- daemon.New(c, hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Trace})).Run(ctx)
		}()
	}

	connect := func(user, pw string) *nats.Conn {
		nc, err := nats.Connect(e.NATS.URL(), nats.UserInfo(user, pw), nats.CustomInboxPrefix("_INBOX_"+user))
		if err != nil {
			t.Fatalf("%s: %v", user, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	pub, op := connect("publisher", "pub-pw"), connect("operator", "op-pw")
	// refused says whether the server refused a publish by nc: it answers
	// -ERR before the flush's PONG, and nats.go keeps it as the last error.
	refused := func(nc *nats.Conn, subject string) bool {
		t.Helper()
		if err := nc.Publish(subject, []byte(`{"all":true}`)); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		err := nc.LastError()
		return err != nil && strings.Contains(err.Error(), `Permissions Violation for Publish to "`+subject+`"`)
	}

	// Publisher: schedule and cancel.
	daemontest.ScheduleServed(t, pub, daemontest.Hdr("Delayd-Target", "orders.cancel", "Delayd-Delay", "1h", "Delayd-Id", "r-1"))
	m := nats.NewMsg("delayd.cancel")
	m.Header.Set("Delayd-Id", "r-1")
	rep, err := pub.RequestMsg(m, 5*time.Second)
	if err != nil || !strings.Contains(string(rep.Data), `"cancelled":true`) {
		t.Fatalf("publisher cancel: %v %v", err, rep)
	}
	daemontest.ScheduleServed(t, pub, daemontest.Hdr("Delayd-Target", "orders.cancel", "Delayd-Delay", "1h", "Delayd-Id", "r-2", "Authorization", "Bearer tok-xyz"))
	// ... but nothing of the operator's or the daemons'.
	for _, subject := range []string{"delayd.admin.get", "delayd.admin.list", "delayd.admin.stats", "delayd.admin.replay",
		"delayd.admin.purge", "delayd.internal.wake.1", "delayd.get", "$SRV.PING"} {
		if !refused(pub, subject) {
			t.Errorf("publisher may publish to %s", subject)
		}
	}
	if refused(pub, "delayd.schedule") {
		t.Error("publisher may not schedule")
	}
	// Nor read anyone else's replies (an operator's get, another
	// service's schedule ids): its inbox prefix is its own.
	for _, subject := range []string{"_INBOX.>", "_INBOX_operator.>", "_INBOX_delayd.>"} {
		if _, err := pub.SubscribeSync(subject); err != nil {
			t.Fatal(err)
		}
		_ = pub.Flush()
		if err := pub.LastError(); err == nil || !strings.Contains(err.Error(), `Subscription to "`+subject+`"`) {
			t.Errorf("publisher may subscribe to %s (last error %v)", subject, err)
		}
	}

	// Operator: the CLI's inspection and dead-set commands.
	getenv := func(k string) string {
		return map[string]string{"DELAYD_NATS_URL": e.NATS.URL(), "DELAYD_NATS_USER": "operator", "DELAYD_NATS_PASSWORD": "op-pw",
			"DELAYD_NATS_INBOX_PREFIX": "_INBOX_operator"}[k]
	}
	cli := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(context.Background(), append([]string{"delayd"}, args...), getenv, &out, &out)
		return out.String(), err
	}
	for _, args := range [][]string{{"get", "r-2"}, {"list"}, {"stats"}, {"dead", "list"}, {"dead", "replay", "--all"}, {"dead", "purge", "--all"}} {
		out, err := cli(args...)
		if err != nil {
			t.Fatalf("operator %v: %v\n%s", args, err, out)
		}
		if args[0] == "get" && (!strings.Contains(out, "Authorization: REDACTED") || strings.Contains(out, "tok-xyz")) {
			t.Errorf("delayd get does not redact Authorization:\n%s", out)
		}
		if args[0] == "list" && !strings.Contains(out, "r-2") {
			t.Errorf("operator list:\n%s", out)
		}
	}
	if !refused(op, "delayd.schedule") {
		t.Error("the operator block may schedule; it should not need to")
	}
	// What `nats micro ls` and `nats micro info delayd` send.
	pingSubject, _ := micro.ControlSubject(micro.PingVerb, "", "")
	infoSubject, _ := micro.ControlSubject(micro.InfoVerb, "delayd", "")
	ping, err := op.Request(pingSubject, nil, 5*time.Second)
	if err != nil || !strings.Contains(string(ping.Data), `"name":"delayd"`) {
		t.Fatalf("$SRV.PING as operator: %v %v", err, ping)
	}
	info, err := op.Request(infoSubject, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("$SRV.INFO.delayd as operator: %v", err)
	}
	for _, subject := range []string{`"delayd.schedule"`, `"delayd.cancel"`, `"delayd.admin.get"`, `"delayd.admin.purge"`} {
		if !strings.Contains(string(info.Data), subject) {
			t.Errorf("service info lacks %s: %s", subject, info.Data)
		}
	}

	// Publisher and daemon: the durable stream intake. The publisher's
	// PubAck, the daemon's stream setup, pulls and acks all pass.
	js, err := jetstream.New(pub)
	if err != nil {
		t.Fatal(err)
	}
	if !testutil.Eventually(10*time.Second, func() bool { // the daemon creates the stream
		_, err = js.PublishMsg(context.Background(), &nats.Msg{Subject: "delayd.intake", Data: []byte("x"),
			Header: daemontest.Hdr("Delayd-Target", "orders.cancel", "Delayd-Delay", "1h", "Delayd-Id", "s-1")})
		return err == nil
	}) {
		t.Fatalf("publisher into delayd.intake: %v", err)
	}
	if !testutil.Eventually(10*time.Second, func() bool { _, err := cli("get", "s-1"); return err == nil }) {
		t.Fatalf("stream envelope not stored under the daemon block:\n%s", logs.String())
	}

	// Daemon: its block lets it deliver (acknowledged only after the
	// server took the publish and found a subscriber, the consumer, so the
	// envelope leaves the store; the no-responders check needs its inbox)
	// and send wake-ups (a refused one is logged as a permissions
	// violation).
	consumer := connect("consumer", "con-pw")
	got := e.Sink(consumer, "orders.cancel")
	daemontest.ScheduleServed(t, pub, daemontest.Hdr("Delayd-Target", "orders.cancel", "Delayd-Delay", "10ms", "Delayd-Id", "r-3"))
	var out string
	if !testutil.Eventually(10*time.Second, func() bool {
		out, err = cli("get", "r-3")
		return err != nil && strings.Contains(err.Error(), "404")
	}) {
		t.Fatalf("r-3 not delivered under the daemon block: %v %s\n%s", err, out, logs.String())
	}
	if got.WaitCount(1, 5*time.Second) != 1 || len(got.Get("r-3")) != 1 {
		t.Errorf("the consumer block got %d deliveries, want r-3 once", got.Count())
	}
	if !refused(consumer, "orders.cancel") {
		t.Error("the consumer block may publish; it should not need to")
	}
	if strings.Contains(logs.String(), "tok-xyz") {
		t.Error("a redacted header value appears in the log")
	}
	if strings.Contains(logs.String(), "Permissions Violation") {
		t.Errorf("the daemon block misses a permission:\n%s", logs.String())
	}
	cancel()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
