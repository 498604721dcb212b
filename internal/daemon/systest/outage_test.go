package systest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/internal/daemon"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// TestRedisDownAtStart: the daemon starts without Redis, answers 503 and
// stores nothing, then works once Redis is up, without a restart.
func TestRedisDownAtStart(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	e.Redis.Kill()
	e.StartServing(c) // not ready without Redis
	nc := e.Conn()
	defer nc.Close()
	s := e.Sink(nc, "outage.target")
	rep, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "outage.target", "Delayd-Delay", "100ms", "Delayd-Id", "o1"), "x")
	if err != nil || rep.Header.Get(micro.ErrorCodeHeader) != "503" {
		t.Fatalf("want 503 while Redis is down, got %v %v", err, rep.Header)
	}
	e.Redis.Start()
	if !testutil.Eventually(10*time.Second, func() bool {
		rep, err = daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "outage.target", "Delayd-Delay", "100ms", "Delayd-Id", "o2"), "x")
		return err == nil && rep.Header.Get(micro.ErrorHeader) == ""
	}) {
		t.Fatalf("intake did not recover: %v %v", err, rep.Header)
	}
	if s.WaitCount(1, 10*time.Second) != 1 || len(s.Get("o2")) != 1 || len(s.Get("o1")) != 0 {
		t.Fatalf("after recovery: o1=%d o2=%d", len(s.Get("o1")), len(s.Get("o2")))
	}
}

// TestNATSDownAtStart: the daemon starts without NATS and serves once NATS
// comes up.
func TestNATSDownAtStart(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	e.NATS.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var logs testutil.Buffer
	go func() {
		done <- daemon.New(c, hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})).Run(ctx)
	}()
	// Nothing is served while NATS is down, and the log must not say so.
	if !testutil.Eventually(10*time.Second, func() bool { return strings.Contains(logs.String(), "not serving until NATS is connected") }) {
		t.Fatalf("with NATS down the log does not say it is not serving:\n%s", logs.String())
	}
	if l := logs.String(); strings.Contains(l, "intake serving") {
		t.Errorf("with NATS down the log says:\n%s", l)
	}
	e.NATS.Start()
	e.WaitService(c.Subject)
	nc := e.Conn()
	defer nc.Close()
	s := e.Sink(nc, "late.target")
	if _, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "late.target", "Delayd-Delay", "100ms", "Delayd-Id", "n1"), "x"); err != nil {
		t.Fatal(err)
	}
	if s.WaitCount(1, 10*time.Second) != 1 {
		t.Fatal("not delivered after NATS came up")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}
