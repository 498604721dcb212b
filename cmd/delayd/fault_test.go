package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/daemon"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// The fault suite delivers into a JetStream stream rather than to a core
// subscriber: the stream keeps every delivery across the faults, and its
// server-side receive time proves "never early" without trusting a test
// client that was itself disconnected.

// faultRun is one workload: envelopes due over a window, each scheduled
// until delayd acknowledged it.
type faultRun struct {
	e      *daemontest.Env
	target string
	stream jetstream.Stream
	mu     sync.Mutex
	acked  map[string]time.Time // id → requested due time
	// resent holds ids whose request was sent again after a failure: if the
	// first one was stored after all and delivered before the second
	// arrived, the second is a new schedule (an upsert) and delivers again.
	resent map[string]bool
}

func newFaultRun(e *daemontest.Env, name string) *faultRun {
	return &faultRun{e: e, target: "fault." + name, stream: stream(e, "F"+name, "fault."+name), acked: map[string]time.Time{}}
}

// faultCfg is e.Config() delivering the fault stream with JetStream.
func faultCfg(e *daemontest.Env) config.Config {
	c := e.Config()
	c.Targets.JetStream = []string{"fault.>"}
	c.Scanner.Lease = time.Second
	return c
}

// schedule sends n envelopes due evenly over window from start, from 8
// workers, retrying each until it is acknowledged or the deadline passes.
// Requests that fail while a fault is on are retried with the same id, so
// a retry after a lost reply is an upsert, not a duplicate.
func (f *faultRun) schedule(nc *nats.Conn, n int, start time.Time, window time.Duration, deadline time.Time) {
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				id := f.target + "-" + strconv.Itoa(i)
				at := start.Add(time.Duration(int64(window) * int64(i) / int64(n)))
				for try := 0; time.Now().Before(deadline); try++ {
					if try == 1 {
						f.mu.Lock()
						if f.resent == nil {
							f.resent = map[string]bool{}
						}
						f.resent[id] = true
						f.mu.Unlock()
					}
					m := &nats.Msg{Subject: "delayd.schedule", Data: []byte(id),
						Header: daemontest.Hdr("Delayd-Target", f.target, "Delayd-Id", id, "Delayd-At", at.UTC().Format(time.RFC3339Nano))}
					rep, err := nc.RequestMsg(m, 2*time.Second)
					if err == nil && rep.Header.Get(micro.ErrorHeader) == "" {
						f.mu.Lock()
						f.acked[id] = at
						f.mu.Unlock()
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
}

// verify waits until every acknowledged envelope is in the stream, then
// checks: none lost, none early; it returns the duplicates, each of which
// must be a redelivery (attempt > 1).
func (f *faultRun) verify(t *testing.T, wait time.Duration) (dups int) {
	t.Helper()
	dups, _ = f.verifyLoss(t, wait, false)
	return dups
}

// verifyLoss is verify that, with allowLoss, reports lost envelopes
// instead of failing on them (for faults that can lose writes by design,
// like a Redis failover with asynchronous replication).
func (f *faultRun) verifyLoss(t *testing.T, wait time.Duration, allowLoss bool) (dups, lost int) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		info, err := f.stream.Info(context.Background())
		if err == nil && info.State.Msgs >= uint64(len(f.acked)) {
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	info, err := f.stream.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	var lateness []time.Duration
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := f.stream.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatalf("get msg %d: %v", seq, err)
		}
		id := m.Header.Get("Delayd-Id")
		due, _ := time.Parse(time.RFC3339Nano, m.Header.Get("Delayd-Due"))
		if m.Time.Before(due) {
			t.Errorf("%s stored in the stream %s before its due time", id, due.Sub(m.Time))
		}
		if want, ok := f.acked[id]; ok && due.Before(want.Truncate(time.Millisecond)) {
			t.Errorf("%s: Delayd-Due %s before the requested %s", id, due, want)
		}
		seen[id]++
		if seen[id] > 1 {
			dups++
			if m.Header.Get("Delayd-Attempt") == "1" && !f.resent[id] {
				t.Errorf("%s: duplicate that is not a redelivery", id)
			}
		} else {
			lateness = append(lateness, m.Time.Sub(due))
		}
	}
	for id := range f.acked {
		if seen[id] == 0 {
			lost++
		}
	}
	if lost > 0 && !allowLoss {
		t.Errorf("%d of %d acknowledged envelopes lost", lost, len(f.acked))
	}
	slices.Sort(lateness)
	if len(lateness) > 0 {
		t.Logf("%d acknowledged, %d delivered, %d duplicates, lateness p50 %s max %s",
			len(f.acked), len(seen), dups, lateness[len(lateness)/2], lateness[len(lateness)-1])
	}
	return dups, lost
}

// TestFaultKill9ThreeTimes kills the daemon process with SIGKILL three
// times at random points of a run and restarts it each time.
func TestFaultKill9ThreeTimes(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := faultCfg(e)
	f := newFaultRun(e, "kill")
	bin := delaydBinary(t)
	nc := e.Conn()
	defer nc.Close()
	p := startProcEnv(e, bin, c, "DELAYD_TARGETS_JETSTREAM=fault.>")
	start := time.Now().Add(time.Second)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.schedule(nc, 3000, start, 6*time.Second, time.Now().Add(30*time.Second))
	}()
	for k := range 3 {
		// One kill in each third of the 6 s delivery window.
		time.Sleep(time.Until(start.Add(time.Duration(k)*2*time.Second + time.Duration(rand.IntN(1500))*time.Millisecond)))
		p.kill()
		t.Logf("kill %d at +%s", k+1, time.Since(start).Round(time.Millisecond))
		p = startProcEnv(e, bin, c, "DELAYD_TARGETS_JETSTREAM=fault.>")
	}
	<-done
	f.verify(t, 20*time.Second)
}

// TestFaultNATSOutage stops NATS for 30 s mid-run and starts it again on
// the same port. Schedule requests fail while it is down; due envelopes
// wait and go out after the reconnect; nothing sits in a reconnect buffer
// counted as delivered.
func TestFaultNATSOutage(t *testing.T) {
	daemontest.Soak(t, "a 30 s NATS outage")
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := faultCfg(e)
	f := newFaultRun(e, "nats")
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	start := time.Now().Add(1500 * time.Millisecond)
	f.schedule(nc, 2000, start, 4*time.Second, time.Now().Add(20*time.Second))
	time.Sleep(time.Until(start.Add(time.Second))) // mid-delivery
	e.NATS.Stop()
	downAt := time.Now()
	if _, err := nats.Connect(e.NATS.URL(), nats.Timeout(500*time.Millisecond)); err == nil {
		t.Error("connected to a stopped NATS")
	}
	if rep, err := nc.RequestMsg(&nats.Msg{Subject: "delayd.schedule", Header: daemontest.Hdr("Delayd-Target", f.target, "Delayd-Delay", "1s")}, time.Second); err == nil {
		t.Errorf("schedule answered while NATS was down: %v", rep.Header)
	}
	time.Sleep(30*time.Second - time.Since(downAt))
	e.NATS.Start()
	dups := f.verify(t, 30*time.Second)
	t.Logf("NATS down for %s; %d duplicates", 30*time.Second, dups)
}

// TestFaultRedisRestart kills Redis (AOF, appendfsync always) mid-run and
// starts it again 3 s later. Intake answers 503 meanwhile, the scanner
// backs off without a hot loop, and nothing acknowledged is lost.
func TestFaultRedisRestart(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t, "--appendonly", "yes", "--appendfsync", "always")
	c := faultCfg(e)
	c.HTTP.SampleInterval = time.Hour // keep the error counter to claims and intake
	f := newFaultRun(e, "redis")
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	start := time.Now().Add(1500 * time.Millisecond)
	f.schedule(nc, 2000, start, 4*time.Second, time.Now().Add(20*time.Second))
	time.Sleep(time.Until(start.Add(time.Second)))
	_, before := httpGet(t, "http://"+c.HTTP.Addr+"/metrics")
	e.Redis.Kill()
	rep, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", f.target, "Delayd-Delay", "1s", "Delayd-Id", "during"), "x")
	if err != nil || rep.Header.Get(micro.ErrorCodeHeader) != "503" {
		t.Errorf("schedule while Redis is down: want 503, got %v %v", err, rep.Header)
	}
	time.Sleep(3 * time.Second)
	_, during := httpGet(t, "http://"+c.HTTP.Addr+"/metrics")
	e.Redis.Start()
	b, _ := metric(before, "delayd_redis_errors_total")
	a, _ := metric(during, "delayd_redis_errors_total")
	t.Logf("Redis errors during a 3 s outage: %v", a-b)
	if a-b > 100 { // a hot loop makes thousands; per-shard backoff makes a few dozen
		t.Errorf("%v Redis errors in 3 s: the scanner is not backing off", a-b)
	}
	f.verify(t, 20*time.Second)
}

// TestFaultScriptFlush flushes Redis' script cache mid-run, then restarts
// Redis (which empties it again); the daemon reloads and carries on.
func TestFaultScriptFlush(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t, "--appendonly", "yes", "--appendfsync", "always")
	c := faultCfg(e)
	f := newFaultRun(e, "flush")
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	start := time.Now().Add(time.Second)
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		time.Sleep(1500 * time.Millisecond)
		_ = e.Redis.Client().ScriptFlush(context.Background()).Err()
		time.Sleep(1500 * time.Millisecond)
		e.Redis.Kill()
		e.Redis.Start()
	}()
	f.schedule(nc, 2000, start, 5*time.Second, time.Now().Add(30*time.Second))
	<-restarted // before the cleanup's Kill reads the process
	f.verify(t, 20*time.Second)
}

// TestFaultClockSkew runs two daemons whose wall clocks are 30 s ahead and
// 30 s behind. Due times and "now" are Redis time, so nothing fires early.
func TestFaultClockSkew(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := faultCfg(e)
	f := newFaultRun(e, "skew")
	e.StartDaemon(c, daemon.WithClock(func() time.Time { return time.Now().Add(30 * time.Second) }))
	c2 := c
	c2.HTTP.Addr = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	e.StartDaemon(c2, daemon.WithClock(func() time.Time { return time.Now().Add(-30 * time.Second) }))
	nc := e.Conn()
	defer nc.Close()
	f.schedule(nc, 1000, time.Now().Add(500*time.Millisecond), 2*time.Second, time.Now().Add(20*time.Second))
	// Relative delays too: converted by Redis, not by a skewed daemon.
	ids := scheduleMany(t, nc, 200, 4, "skew-d", func(i int, h nats.Header) {
		h.Set("Delayd-Target", f.target)
		h.Set("Delayd-Delay", strconv.Itoa(300+i)+"ms")
	})
	f.mu.Lock()
	for _, id := range ids {
		f.acked[id] = time.Time{}
	}
	f.mu.Unlock()
	if dups := f.verify(t, 15*time.Second); dups != 0 {
		t.Errorf("%d duplicates without a crash", dups)
	}
}
