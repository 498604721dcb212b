package systest

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/internal/daemon"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// The fault suite delivers into a JetStream stream rather than to a core
// subscriber: the stream keeps every delivery across the faults, and its
// server-side receive time proves "never early" without trusting a test
// client that was itself disconnected.

// TestFaultNATSOutage stops NATS for 30 s mid-run and starts it again on
// the same port. Schedule requests fail while it is down; due envelopes
// wait and go out after the reconnect; nothing sits in a reconnect buffer
// counted as delivered.
func TestFaultNATSOutage(t *testing.T) {
	daemontest.Soak(t, "a 30 s NATS outage")
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := daemontest.JetStreamConfig(e)
	f := daemontest.NewWorkload(e, "nats")
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	start := time.Now().Add(1500 * time.Millisecond)
	f.Schedule(nc, 2000, start, 4*time.Second, time.Now().Add(20*time.Second))
	time.Sleep(time.Until(start.Add(time.Second))) // mid-delivery
	e.NATS.Stop()
	downAt := time.Now()
	if _, err := nats.Connect(e.NATS.URL(), nats.Timeout(500*time.Millisecond)); err == nil {
		t.Error("connected to a stopped NATS")
	}
	if rep, err := nc.RequestMsg(&nats.Msg{Subject: "delayd.schedule", Header: daemontest.Hdr("Delayd-Target", f.Target(), "Delayd-Delay", "1s")}, time.Second); err == nil {
		t.Errorf("schedule answered while NATS was down: %v", rep.Header)
	}
	time.Sleep(30*time.Second - time.Since(downAt))
	e.NATS.Start()
	dups := f.Verify(t, 30*time.Second)
	t.Logf("NATS down for %s; %d duplicates", 30*time.Second, dups)
}

// TestFaultRedisRestart kills Redis (AOF, appendfsync always) mid-run and
// starts it again 3 s later. Intake answers 503 meanwhile, the scanner
// backs off without a hot loop, and nothing acknowledged is lost.
func TestFaultRedisRestart(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t, "--appendonly", "yes", "--appendfsync", "always")
	c := daemontest.JetStreamConfig(e)
	c.HTTP.SampleInterval = time.Hour // keep the error counter to claims and intake
	f := daemontest.NewWorkload(e, "redis")
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	start := time.Now().Add(1500 * time.Millisecond)
	f.Schedule(nc, 2000, start, 4*time.Second, time.Now().Add(20*time.Second))
	time.Sleep(time.Until(start.Add(time.Second)))
	_, before := daemontest.HTTPGet(t, "http://"+c.HTTP.Addr+"/metrics")
	e.Redis.Kill()
	rep, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", f.Target(), "Delayd-Delay", "1s", "Delayd-Id", "during"), "x")
	if err != nil || rep.Header.Get(micro.ErrorCodeHeader) != "503" {
		t.Errorf("schedule while Redis is down: want 503, got %v %v", err, rep.Header)
	}
	time.Sleep(3 * time.Second)
	_, during := daemontest.HTTPGet(t, "http://"+c.HTTP.Addr+"/metrics")
	e.Redis.Start()
	b, _ := daemontest.Metric(before, "delayd_redis_errors_total")
	a, _ := daemontest.Metric(during, "delayd_redis_errors_total")
	t.Logf("Redis errors during a 3 s outage: %v", a-b)
	if a-b > 100 { // a hot loop makes thousands; per-shard backoff makes a few dozen
		t.Errorf("%v Redis errors in 3 s: the scanner is not backing off", a-b)
	}
	f.Verify(t, 20*time.Second)
}

// TestFaultScriptFlush flushes Redis' script cache and functions mid-run,
// then restarts Redis (which empties the script cache again); the daemon
// reloads and carries on.
func TestFaultScriptFlush(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t, "--appendonly", "yes", "--appendfsync", "always")
	c := daemontest.JetStreamConfig(e)
	f := daemontest.NewWorkload(e, "flush")
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	start := time.Now().Add(time.Second)
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		time.Sleep(1500 * time.Millisecond)
		_ = e.Redis.Client().ScriptFlush(context.Background()).Err()
		_ = e.Redis.Client().FunctionFlush(context.Background()).Err()
		time.Sleep(1500 * time.Millisecond)
		e.Redis.Kill()
		e.Redis.Start()
	}()
	f.Schedule(nc, 2000, start, 5*time.Second, time.Now().Add(30*time.Second))
	<-restarted // before the cleanup's Kill reads the process
	f.Verify(t, 20*time.Second)
}

// TestFaultClockSkew runs two daemons whose wall clocks are 30 s ahead and
// 30 s behind. Due times and "now" are Redis time, so nothing fires early.
func TestFaultClockSkew(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := daemontest.JetStreamConfig(e)
	f := daemontest.NewWorkload(e, "skew")
	e.StartDaemon(c, daemon.WithClock(func() time.Time { return time.Now().Add(30 * time.Second) }))
	c2 := c
	c2.HTTP.Addr = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	e.StartDaemon(c2, daemon.WithClock(func() time.Time { return time.Now().Add(-30 * time.Second) }))
	nc := e.Conn()
	defer nc.Close()
	f.Schedule(nc, 1000, time.Now().Add(500*time.Millisecond), 2*time.Second, time.Now().Add(20*time.Second))
	// Relative delays too: converted by Redis, not by a skewed daemon.
	ids := daemontest.ScheduleMany(t, nc, 200, 4, "skew-d", func(i int, h nats.Header) {
		h.Set("Delayd-Target", f.Target())
		h.Set("Delayd-Delay", strconv.Itoa(300+i)+"ms")
	})
	f.Expect(ids...)
	if dups := f.Verify(t, 15*time.Second); dups != 0 {
		t.Errorf("%d duplicates without a crash", dups)
	}
}
