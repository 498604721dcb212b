package daemontest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/daemon"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// Env is one test's servers: a redis-server process and an in-process
// nats-server. Build one with NewEnv, or as a literal when a test needs
// servers of its own (a cluster node, a NATS server with permissions).
type Env struct {
	T     testing.TB
	Redis *testutil.Redis
	NATS  *testutil.NATS
}

// NewEnv starts a redis-server (with redisArgs) and a nats-server for t.
func NewEnv(t testing.TB, redisArgs ...string) *Env {
	t.Helper()
	return &Env{T: t, Redis: testutil.StartRedis(t, redisArgs...), NATS: testutil.StartNATS(t)}
}

// Config is a config for this env with test-friendly timings: 8 shards, a
// 2 s lease, a 200 ms idle interval, a 1 s ownership TTL, the admin server
// on a free port (tests read it) and the console on any.
func (e *Env) Config() config.Config {
	c := config.Default()
	c.NATS.URL = e.NATS.URL()
	c.Redis.Addrs = []string{e.Redis.Addr}
	c.Shards = 8
	c.Scanner.Lease = 2 * time.Second
	c.Scanner.IdleInterval = 200 * time.Millisecond
	c.Scanner.RetryBackoff = 100 * time.Millisecond
	c.Ownership.TTL = time.Second
	c.HTTP.Addr = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(e.T))
	c.UI.Addr = "127.0.0.1:0" // copies of this config run side by side
	return c
}

// StartDaemon runs a daemon in-process, waits until it is ready, and
// returns a function that stops it gracefully and reports its error. The
// test's cleanup stops it too. Ready is /readyz's 200 where the config has
// an admin port of its own (Config's): a daemon serves requests before it
// has proven its delivery inbox and taken its shards, and tests that
// assumed more than serving failed under load (three in CI). A test whose
// daemon is not meant to become ready uses StartServing.
func (e *Env) StartDaemon(c config.Config, opts ...daemon.Option) (stop func() error) {
	e.T.Helper()
	stop = e.StartServing(c, opts...)
	if _, port, err := net.SplitHostPort(c.HTTP.Addr); err == nil && port != "0" {
		e.WaitReady(c)
	}
	return stop
}

// StartServing is StartDaemon that returns as soon as the daemon answers
// requests, ready or not.
func (e *Env) StartServing(c config.Config, opts ...daemon.Option) (stop func() error) {
	e.T.Helper()
	d := Run(e.T, c, opts...)
	d.WaitServing(e.T, e.NATS.URL(), c.Subject)
	return d.Stop
}

// WaitReady waits until the daemon of c answers /readyz with 200: it
// serves requests before it has proven its delivery inbox and taken its
// shards, which readiness waits for.
func (e *Env) WaitReady(c config.Config) {
	e.T.Helper()
	var err error
	if !testutil.Eventually(10*time.Second, func() bool {
		var resp *http.Response
		if resp, err = http.Get("http://" + c.HTTP.Addr + "/readyz"); err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}) {
		e.T.Fatalf("/readyz on %s not 200 within 10 s (%v)", c.HTTP.Addr, err)
	}
}

// WaitService waits until a delayd answers on the subject.
func (e *Env) WaitService(subject string) {
	e.T.Helper()
	WaitService(e.T, e.NATS.URL(), subject)
}

// Conn is a connection to the env's NATS server that reconnects forever;
// the caller closes it.
func (e *Env) Conn() *nats.Conn {
	e.T.Helper()
	nc, err := nats.Connect(e.NATS.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		e.T.Fatal(err)
	}
	return nc
}

// Delivery is one message received on a target.
type Delivery struct {
	ID       string
	Data     string
	Header   nats.Header
	Due      time.Time
	Attempt  int
	Received time.Time
}

// Sink subscribes to a target and records every delivery.
type Sink struct {
	mu   sync.Mutex
	got  map[string][]Delivery
	n    int
	cond chan struct{}
	nc   *nats.Conn
}

// Sink subscribes to subject on nc and records what arrives.
func (e *Env) Sink(nc *nats.Conn, subject string) *Sink {
	e.T.Helper()
	s := &Sink{got: map[string][]Delivery{}, cond: make(chan struct{}, 1), nc: nc}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		now := time.Now()
		due, _ := time.Parse(time.RFC3339Nano, m.Header.Get(envelope.HeaderDue))
		attempt, _ := strconv.Atoi(m.Header.Get(envelope.HeaderAttempt))
		d := Delivery{ID: m.Header.Get(envelope.HeaderID), Data: string(m.Data), Header: m.Header, Due: due, Attempt: attempt, Received: now}
		s.mu.Lock()
		s.got[d.ID] = append(s.got[d.ID], d)
		s.n++
		s.mu.Unlock()
		select {
		case s.cond <- struct{}{}:
		default:
		}
	})
	if err != nil {
		e.T.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		e.T.Fatal(err)
	}
	return s
}

// Settle returns once the sink has recorded every message the server sent
// its connection before the call: the flush's PONG comes after them, and
// the barrier runs after their callbacks. A delivery counts as published
// only once the server took it, and is acknowledged in Redis after that,
// so after Quiet (nothing stored, nothing in flight) and Settle, a
// delivery that has not arrived never will.
func (s *Sink) Settle(t testing.TB) {
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

// Quiet waits until nothing is stored under c's namespace (every envelope
// delivered and acknowledged, none in flight), for at most 10 s, then
// settles the sinks: past it, a delivery that has not arrived never will.
// It asserts nothing of that, so the test's own checks say what went
// wrong. It does assert that every byte budget of the daemon serving
// c.HTTP.Addr (its delayd_..._held_bytes gauges) is back to 0 within
// 10 s: bytes never given back would stall that daemon for good later.
func Quiet(t testing.TB, e *Env, c config.Config, sinks ...*Sink) {
	t.Helper()
	testutil.Eventually(10*time.Second, func() bool { return e.Stored(c) == 0 })
	for _, s := range sinks {
		s.Settle(t)
	}
	if held := waitBudgets(c.HTTP.Addr, 10*time.Second); len(held) > 0 {
		t.Errorf("quiet, but byte budgets still held after 10 s: %s", strings.Join(held, ", "))
	}
}

var heldRE = regexp.MustCompile(`(?m)^(delayd_\w+_held_bytes) (\S+)$`)

// waitBudgets waits up to d for every delayd_..._held_bytes gauge of the
// daemon at addr to read 0, and returns those that do not ("name value").
// A daemon without an admin port of its own, or one that stopped, has
// none to read.
func waitBudgets(addr string, d time.Duration) []string {
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "0" {
		return nil
	}
	var held []string
	testutil.Eventually(d, func() bool {
		held = nil
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return true
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return true
		}
		for _, m := range heldRE.FindAllStringSubmatch(string(body), -1) {
			if m[2] != "0" {
				held = append(held, m[1]+" "+m[2])
			}
		}
		return len(held) == 0
	})
	return held
}

// WaitIDs waits until every one of ids has arrived at least once, or d
// passes.
func (s *Sink) WaitIDs(ids []string, d time.Duration) {
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

// WaitCount waits until at least n deliveries arrived or d passes, and
// returns how many did.
func (s *Sink) WaitCount(n int, d time.Duration) int {
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

// WaitFor waits until ok holds for the deliveries of id, or d passes, and
// returns them.
func (s *Sink) WaitFor(id string, d time.Duration, ok func([]Delivery) bool) []Delivery {
	deadline := time.After(d)
	for {
		if ds := s.Get(id); ok(ds) {
			return ds
		}
		select {
		case <-s.cond:
		case <-deadline:
			return s.Get(id)
		}
	}
}

// Count is the number of deliveries so far.
func (s *Sink) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// Get is the deliveries of id so far, in order of arrival.
func (s *Sink) Get(id string) []Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Delivery(nil), s.got[id]...)
}

// All is every delivery so far, by id.
func (s *Sink) All() map[string][]Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	all := make(map[string][]Delivery, len(s.got))
	for id, ds := range s.got {
		all[id] = append([]Delivery(nil), ds...)
	}
	return all
}

// Check verifies that every id arrived, none early; it returns lateness
// samples and the number of duplicates.
func (s *Sink) Check(t testing.TB, ids []string) (lateness []time.Duration, dups int) {
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
		if len(ds) > 1 && dups < 5 { // say whether they were redeliveries
			attempts := make([]int, len(ds))
			for i, d := range ds {
				attempts[i] = d.Attempt
			}
			t.Logf("%s delivered %d times, attempts %v", id, len(ds), attempts)
		}
		dups += len(ds) - 1
		for _, d := range ds {
			if d.Received.Before(d.Due) {
				t.Errorf("%s delivered %s early", id, d.Due.Sub(d.Received))
			}
		}
		lateness = append(lateness, ds[0].Received.Sub(ds[0].Due))
	}
	if lost > 0 {
		t.Errorf("%d of %d envelopes lost", lost, len(ids))
	}
	return lateness, dups
}

// Schedule sends one schedule request and returns the reply or error.
func Schedule(nc *nats.Conn, subject string, h nats.Header, payload string) (*nats.Msg, error) {
	m := &nats.Msg{Subject: subject + ".schedule", Header: h, Data: []byte(payload)}
	return nc.RequestMsg(m, 5*time.Second)
}

// Hdr is a header of key, value pairs.
func Hdr(kv ...string) nats.Header {
	h := nats.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// InspectStore opens the config's delay set for direct inspection; the
// test's cleanup closes it.
func (e *Env) InspectStore(c config.Config) *store.Store {
	e.T.Helper()
	st := store.New(store.NewClient(store.Options{Addrs: []string{e.Redis.Addr}}), c.Namespace, c.Shards)
	e.T.Cleanup(func() { st.Close() })
	return st
}

// Stored counts envelopes kept under the config's namespace, in any state.
func (e *Env) Stored(c config.Config) int64 {
	e.T.Helper()
	shards, _, err := e.InspectStore(c).Stats(context.Background())
	if err != nil {
		e.T.Fatal(err)
	}
	var n int64
	for _, sh := range shards {
		n += sh.Counts.Pending + sh.Counts.Inflight + sh.Counts.Dead
	}
	return n
}

// SkipShort skips a long test under -short, except under CI=true, where
// every test runs.
func SkipShort(t testing.TB, why string) {
	t.Helper()
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip(why)
	}
}

// Soak skips an endurance run (a chaos soak, a long outage, a measurement)
// unless DELAYD_SOAK=1, so the README's test command stays within minutes;
// .ci/run runs these in a second step, by name (cmd/delayd's
// TestSoaksRunInCI checks every one is named). It is about time, not
// dependencies: a missing redis-server still fails under CI=true.
func Soak(t testing.TB, what string) {
	t.Helper()
	if os.Getenv("DELAYD_SOAK") != "1" {
		t.Skipf("%s: a soak, run with DELAYD_SOAK=1", what)
	}
}

// ScheduleServed retries a schedule request until a delayd answers it
// without an error (a daemon that just started, or a server that just came
// back), failing the test after 10 s.
func ScheduleServed(t testing.TB, nc *nats.Conn, h nats.Header) {
	t.Helper()
	var err error
	if !testutil.Eventually(10*time.Second, func() bool {
		var rep *nats.Msg
		rep, err = Schedule(nc, "delayd", h, "x")
		return err == nil && rep.Header.Get("Nats-Service-Error") == ""
	}) {
		t.Fatalf("schedule not served: %v", err)
	}
}
