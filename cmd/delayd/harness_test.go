package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/daemon"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// env is one test's servers: a redis-server process and an in-process
// nats-server.
type env struct {
	t     testing.TB
	redis *testutil.Redis
	nats  *testutil.NATS
}

func newEnv(t testing.TB, redisArgs ...string) *env {
	t.Helper()
	return &env{t: t, redis: testutil.StartRedis(t, redisArgs...), nats: testutil.StartNATS(t)}
}

// cfg is a config for this env with test-friendly timings.
func (e *env) cfg() config.Config {
	c := config.Default()
	c.NATS.URL = e.nats.URL()
	c.Redis.Addrs = []string{e.redis.Addr}
	c.Shards = 8
	c.Scanner.Lease = 2 * time.Second
	c.Scanner.IdleInterval = 200 * time.Millisecond
	c.Scanner.RetryBackoff = 100 * time.Millisecond
	c.Ownership.TTL = time.Second
	c.HTTP.Addr = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(e.t))
	c.UI.Addr = "127.0.0.1:0" // copies of this config run side by side
	return c
}

// startDaemon runs a daemon in-process and returns a function that stops it
// gracefully and reports its error.
func (e *env) startDaemon(c config.Config, opts ...daemon.Option) (stop func() error) {
	e.t.Helper()
	d := daemontest.Run(e.t, c, opts...)
	d.WaitServing(e.t, e.nats.URL(), c.Subject)
	return d.Stop
}

// waitReady waits until the daemon of c answers /readyz with 200: it
// serves requests before it has proven its delivery inbox and taken its
// shards, which readiness waits for.
func (e *env) waitReady(c config.Config) {
	e.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get("http://" + c.HTTP.Addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("/readyz on %s not 200 within 10 s (%v)", c.HTTP.Addr, err)
		}
	}
}

// waitService waits until a delayd answers on the subject.
func (e *env) waitService(subject string) {
	e.t.Helper()
	daemontest.WaitService(e.t, e.nats.URL(), subject)
}

func (e *env) conn() *nats.Conn {
	e.t.Helper()
	nc, err := nats.Connect(e.nats.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		e.t.Fatal(err)
	}
	return nc
}

// delivery is one message received on a target.
type delivery struct {
	id       string
	data     string
	header   nats.Header
	due      time.Time
	attempt  int
	received time.Time
}

// sink subscribes to a target and records every delivery.
type sink struct {
	mu   sync.Mutex
	got  map[string][]delivery
	n    int
	cond chan struct{}
	nc   *nats.Conn
}

func (e *env) sink(nc *nats.Conn, subject string) *sink {
	e.t.Helper()
	s := &sink{got: map[string][]delivery{}, cond: make(chan struct{}, 1), nc: nc}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		now := time.Now()
		due, _ := time.Parse(time.RFC3339Nano, m.Header.Get(envelope.HeaderDue))
		attempt, _ := strconv.Atoi(m.Header.Get(envelope.HeaderAttempt))
		d := delivery{id: m.Header.Get(envelope.HeaderID), data: string(m.Data), header: m.Header, due: due, attempt: attempt, received: now}
		s.mu.Lock()
		s.got[d.id] = append(s.got[d.id], d)
		s.n++
		s.mu.Unlock()
		select {
		case s.cond <- struct{}{}:
		default:
		}
	})
	if err != nil {
		e.t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		e.t.Fatal(err)
	}
	return s
}

// settle returns once the sink has recorded every message the server sent
// its connection before the call: the flush's PONG comes after them, and
// the barrier runs after their callbacks. A delivery counts as published
// only once the server took it, and is acknowledged in Redis after that,
// so after waitGone (nothing stored, nothing in flight) and settle, a
// delivery that has not arrived never will.
func (s *sink) settle(t testing.TB) {
	t.Helper()
	if err := s.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	if err := s.nc.Barrier(func() { close(done) }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the sink's callbacks did not drain")
	}
}

// quiet waits until nothing is stored under c's namespace (every envelope
// delivered and acknowledged, none in flight), for at most 10 s, then
// settles the sinks: past it, a delivery that has not arrived never will.
// It asserts nothing, so the test's own checks say what went wrong.
func quiet(t *testing.T, e *env, c config.Config, sinks ...*sink) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); e.stored(c) > 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	for _, s := range sinks {
		s.settle(t)
	}
}

// waitIDs waits until every one of ids has arrived at least once, or d
// passes.
func (s *sink) waitIDs(ids []string, d time.Duration) {
	deadline := time.After(d)
	for {
		s.mu.Lock()
		missing := slices.ContainsFunc(ids, func(id string) bool { return len(s.got[id]) == 0 })
		s.mu.Unlock()
		if !missing {
			return
		}
		select {
		case <-s.cond:
		case <-deadline:
			return
		}
	}
}

// waitCount waits until at least n deliveries arrived or d passes.
func (s *sink) waitCount(n int, d time.Duration) int {
	deadline := time.After(d)
	for {
		s.mu.Lock()
		got := s.n
		s.mu.Unlock()
		if got >= n {
			return got
		}
		select {
		case <-s.cond:
		case <-deadline:
			return got
		}
	}
}

func (s *sink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func (s *sink) get(id string) []delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]delivery(nil), s.got[id]...)
}

// check verifies that every id arrived, none early; it returns lateness
// samples and the number of duplicates.
func (s *sink) check(t testing.TB, ids []string) (lateness []time.Duration, dups int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	lost := 0
	for _, id := range ids {
		ds := s.got[id]
		if len(ds) == 0 {
			lost++
			continue
		}
		dups += len(ds) - 1
		for _, d := range ds {
			if d.received.Before(d.due) {
				t.Errorf("%s delivered %s early", id, d.due.Sub(d.received))
			}
		}
		lateness = append(lateness, ds[0].received.Sub(ds[0].due))
	}
	if lost > 0 {
		t.Errorf("%d of %d envelopes lost", lost, len(ids))
	}
	return lateness, dups
}

// schedule sends one schedule request and returns the reply or error.
func schedule(nc *nats.Conn, subject string, h nats.Header, payload string) (*nats.Msg, error) {
	m := &nats.Msg{Subject: subject + ".schedule", Header: h, Data: []byte(payload)}
	return nc.RequestMsg(m, 5*time.Second)
}

func hdr(kv ...string) nats.Header {
	h := nats.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// inspectStore opens the config's delay set for direct inspection.
func (e *env) inspectStore(c config.Config) *store.Store {
	e.t.Helper()
	st := store.New(store.NewClient(store.Options{Addrs: []string{e.redis.Addr}}), c.Namespace, c.Shards)
	e.t.Cleanup(func() { st.Close() })
	return st
}

// stored counts envelopes kept under the config's namespace, in any state.
func (e *env) stored(c config.Config) int64 {
	e.t.Helper()
	shards, _, err := e.inspectStore(c).Stats(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	var n int64
	for _, sh := range shards {
		n += sh.Counts.Pending + sh.Counts.Inflight + sh.Counts.Dead
	}
	return n
}

// skipShort skips a long test under -short, except under CI=true, where
// every test runs.
func skipShort(t *testing.T, why string) {
	t.Helper()
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip(why)
	}
}

// scheduleServed retries a schedule request until a delayd answers it
// without an error (a daemon that just started, or a server that just came
// back), failing the test after 10 s.
func scheduleServed(t *testing.T, nc *nats.Conn, h nats.Header) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rep, err := schedule(nc, "delayd", h, "x")
		if err == nil && rep.Header.Get("Nats-Service-Error") == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("schedule not served: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// killOnFirst subscribes to subject and kills p with SIGKILL when the first
// message arrives: the daemon dies with the rest of its batch claimed and
// not acknowledged. It counts every message seen.
func killOnFirst(t *testing.T, nc *nats.Conn, subject string, p *proc) (killed *atomic.Bool, seen *atomic.Int64) {
	t.Helper()
	killed, seen = new(atomic.Bool), new(atomic.Int64)
	if _, err := nc.Subscribe(subject, func(*nats.Msg) {
		seen.Add(1)
		if killed.CompareAndSwap(false, true) {
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return killed, seen
}
