package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/testutil"
)

// delayd intake migrate moves a work-queue intake stream (made by a daemon
// configured as before 0.2.0) to the limits layout while a daemon runs:
// what waited in the old stream and what is published after it are each
// delivered once, and the stream has the limits layout.
func TestIntakeMigrateCommand(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Intake.Stream.Enabled = "true"
	c.HTTP.Addr = ""
	old := c
	old.Intake.Stream.Retention = "workqueue"
	stopOld := e.StartDaemon(old) // makes the work queue, then stops
	nc := e.Conn()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// Without an admin port StartDaemon waits only until requests are
	// served: the stream intake may not have made its stream yet.
	if !testutil.Eventually(10*time.Second, func() bool {
		_, err = js.Stream(context.Background(), c.Intake.Stream.Name)
		return err == nil
	}) {
		t.Fatalf("the old daemon made no intake stream: %v", err)
	}
	if err := stopOld(); err != nil {
		t.Fatal(err)
	}
	got := e.Sink(nc, "mig.t")
	publish := func(prefix string, n int) []string {
		var ids []string
		for i := range n {
			id := fmt.Sprintf("%s-%d", prefix, i)
			m := &nats.Msg{Subject: c.Subject + ".intake", Data: []byte("x"), Header: daemontest.Hdr(envelope.HeaderTarget, "mig.t",
				envelope.HeaderDelay, "1ms", envelope.HeaderID, id)}
			if _, err := js.PublishMsg(context.Background(), m); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		return ids
	}
	ids := publish("before", 100) // wait in the work queue: no daemon runs
	e.StartDaemon(c)
	var stderr bytes.Buffer
	noEnv := func(string) string { return "" }
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, []string{"delayd", "intake", "migrate", "--nats-url", c.NATS.URL}, noEnv, &stderr, &stderr); err != nil {
		t.Fatalf("delayd intake migrate: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "migrated") {
		t.Errorf("the command's log does not say it migrated:\n%s", stderr.String())
	}
	ids = append(ids, publish("after", 100)...)
	got.WaitIDs(ids, 20*time.Second)
	daemontest.Quiet(t, e, c, got)
	if _, dups := got.Check(t, ids); dups != 0 {
		t.Errorf("%d envelopes delivered twice", dups)
	}
	s, err := js.Stream(context.Background(), c.Intake.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := s.CachedInfo().Config; cfg.Retention != jetstream.LimitsPolicy || cfg.Metadata["delayd_layout"] != "limits-purged-below-ack-floor" {
		t.Errorf("after delayd intake migrate: retention %v, metadata %v", cfg.Retention, cfg.Metadata)
	}
}

// Under docs/security.md's permission block, the daemon user drains both
// streams of a migration and the migrator user runs delayd intake migrate.
func TestIntakeMigrateUnderThePermissionBlock(t *testing.T) {
	t.Parallel()
	e := permissionEnv(t)
	c := e.Config()
	c.NATS.User, c.NATS.Password, c.NATS.InboxPrefix = "delayd", "delayd-pw", "_INBOX_delayd"
	c.Targets.Allow = []string{"orders.>"}
	c.Intake.Stream.Enabled = "true"
	c.HTTP.Addr = ""
	old := c
	old.Intake.Stream.Retention = "workqueue"
	d := daemontest.Run(t, old)
	conn := func(user, pw string) *nats.Conn {
		nc, err := nats.Connect(e.NATS.URL(), nats.UserInfo(user, pw), nats.CustomInboxPrefix("_INBOX_"+user))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	js, err := jetstream.New(conn("publisher", "pub-pw"))
	if err != nil {
		t.Fatal(err)
	}
	mig, err := jetstream.New(conn("migrator", "mig-pw"))
	if err != nil {
		t.Fatal(err)
	}
	if !testutil.Eventually(10*time.Second, func() bool {
		_, err = mig.Consumer(context.Background(), "DELAYD_INTAKE", "DELAYD_INTAKE")
		return err == nil
	}) {
		t.Fatalf("the work-queue daemon set up no intake stream: %v", err)
	}
	if err := d.Stop(); err != nil { // the work queue stays
		t.Fatal(err)
	}
	got := e.Sink(conn("consumer", "con-pw"), "orders.migrated")
	var ids []string
	publish := func(prefix string) {
		for i := range 50 {
			id := fmt.Sprintf("%s-%d", prefix, i)
			m := &nats.Msg{Subject: "delayd.intake", Data: []byte("x"), Header: daemontest.Hdr(envelope.HeaderTarget, "orders.migrated",
				envelope.HeaderDelay, "1ms", envelope.HeaderID, id)}
			if _, err := js.PublishMsg(context.Background(), m); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
	}
	publish("before")
	daemontest.Run(t, c)
	var stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := []string{"delayd", "intake", "migrate", "--nats-url", c.NATS.URL,
		"--set", "nats.user=migrator", "--set", "nats.password=mig-pw", "--set", "nats.inbox_prefix=_INBOX_migrator"}
	if err := run(ctx, args, func(string) string { return "" }, &stderr, &stderr); err != nil {
		t.Fatalf("delayd intake migrate as the migrator: %v\n%s", err, stderr.String())
	}
	publish("after")
	got.WaitIDs(ids, 20*time.Second)
	daemontest.Quiet(t, e, c, got)
	if _, dups := got.Check(t, ids); dups != 0 {
		t.Errorf("%d envelopes delivered twice", dups)
	}
}
