package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// proc is a delayd daemon running as a real child process.
type proc struct {
	cmd *exec.Cmd
	log string
}

func startProc(e *daemontest.Env, bin string, c config.Config) *proc {
	e.T.Helper()
	return startProcEnv(e, bin, c)
}

// startProcEnv starts a daemon process with extra environment settings.
func startProcEnv(e *daemontest.Env, bin string, c config.Config, extra ...string) *proc {
	e.T.Helper()
	cmd := exec.Command(bin, "run")
	cmd.Env = append(append(os.Environ(), extra...),
		"DELAYD_NATS_URL="+c.NATS.URL,
		"DELAYD_REDIS_ADDRS="+c.Redis.Addrs[0],
		"DELAYD_SHARDS="+strconv.Itoa(c.Shards),
		"DELAYD_SCANNER_LEASE="+c.Scanner.Lease.String(),
		"DELAYD_SCANNER_IDLE_INTERVAL="+c.Scanner.IdleInterval.String(),
		"DELAYD_HTTP_ADDR=127.0.0.1:0",
		"DELAYD_UI_ADDR=127.0.0.1:0",
		"DELAYD_OWNERSHIP_TTL="+c.Ownership.TTL.String(),
	)
	logPath := filepath.Join(e.T.TempDir(), "delayd.log")
	logf, err := os.Create(logPath)
	if err != nil {
		e.T.Fatal(err)
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		e.T.Fatal(err)
	}
	p := &proc{cmd: cmd, log: logPath}
	e.T.Cleanup(func() {
		p.kill()
		logf.Close()
		if e.T.Failed() {
			b, _ := os.ReadFile(logPath)
			e.T.Logf("daemon log %s:\n%s", logPath, b)
		}
	})
	testutil.Wait(e.T, 10*time.Second, "the daemon process logs ready", func() bool {
		b, _ := os.ReadFile(logPath)
		return strings.Contains(string(b), "delayd: ready")
	})
	return p
}

func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
}

// TestKill9BetweenClaimAndAck kills the daemon with SIGKILL the moment the
// first of a burst of deliveries reaches the target, while the rest of the
// burst is claimed but not yet acknowledged. Those must still be in flight
// in Redis and be delivered again by a new daemon once their lease expires.
func TestKill9BetweenClaimAndAck(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Scanner.Lease = time.Second
	bin := delaydBinary(t)
	nc := e.Conn()
	defer nc.Close()
	st := store.New(store.NewClient(store.Options{Addrs: c.Redis.Addrs}), c.Namespace, c.Shards)
	defer st.Close()

	// The daemon reaches NATS through a proxy that holds the server's
	// replies back 300 ms: the flush that confirms the deliveries, and so
	// the ack, comes well after the first delivery reached the target, so
	// the kill lands between them however fast the machine is.
	proxy := testutil.StartProxy(t, fmt.Sprintf("127.0.0.1:%d", e.NATS.Opts.Port))
	slow := c
	slow.NATS.URL = "nats://" + proxy.Addr()
	p := startProc(e, bin, slow)
	proxy.Set(testutil.Down, testutil.Fault{Latency: 300 * time.Millisecond})
	first := e.Sink(nc, "crash.target")
	killed, _ := killOnFirst(t, nc, "crash.target", p)
	const n = 500
	at := time.Now().Add(500 * time.Millisecond).UTC().Format(time.RFC3339Nano)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "crash-" + strconv.Itoa(i)
		m := &nats.Msg{Subject: "delayd.schedule", Header: daemontest.Hdr("Delayd-Target", "crash.target", "Delayd-At", at, "Delayd-Id", ids[i]), Data: []byte(ids[i])}
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	// One request/reply after the burst: once it is answered, the queue
	// group's single member has stored everything sent before it.
	if _, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "crash.target", "Delayd-At", at, "Delayd-Id", "crash-last"), "crash-last"); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, "crash-last")
	_ = p.cmd.Wait()
	if !killed.Load() {
		t.Fatal("daemon exited without being killed")
	}
	var inflight []string
	for _, id := range ids {
		if en, err := st.Get(context.Background(), id); err == nil && en.State == store.StateInflight {
			inflight = append(inflight, id)
		}
	}
	if len(inflight) == 0 {
		t.Fatal("kill -9 did not land between claim and ack: nothing in flight")
	}
	t.Logf("killed with %d envelopes claimed but not acknowledged", len(inflight))

	// The redeliveries are watched by a subscription made after the kill:
	// with nats-server 2.14 and 2.15 alike, subscribers that were receiving
	// from the publisher at the moment it was killed got later messages
	// from other publishers up to ~10 s late, a broker-side effect that
	// would make this test measure NATS rather than delayd.
	sc := e.Conn()
	defer sc.Close()
	second := e.Sink(sc, "crash.target")
	startProc(e, bin, c)
	second.WaitCount(len(inflight), 10*time.Second)
	daemontest.Quiet(t, e, c, first, second)
	for _, id := range ids {
		a, b := first.Get(id), second.Get(id)
		if len(a)+len(b) == 0 {
			t.Errorf("%s lost", id)
		}
		for _, d := range append(a, b...) {
			if d.Received.Before(d.Due) {
				t.Errorf("%s early", id)
			}
		}
	}
	for _, id := range inflight {
		ds := second.Get(id)
		if len(ds) != 1 || ds[0].Attempt != 2 || ds[0].Data != id {
			t.Errorf("%s claimed at the kill: redelivered %+v", id, ds)
			continue
		}
		if a := first.Get(id); len(a) == 1 && !a[0].Due.Equal(ds[0].Due) {
			t.Errorf("%s: Delayd-Due changed on redelivery", id)
		}
	}
	if n := e.Stored(c); n != 0 {
		t.Fatalf("%d envelopes left after redelivery", n)
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

// TestFaultKill9ThreeTimes kills the daemon process with SIGKILL three
// times at random points of a run and restarts it each time.
func TestFaultKill9ThreeTimes(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := daemontest.JetStreamConfig(e)
	f := daemontest.NewWorkload(e, "kill")
	bin := delaydBinary(t)
	nc := e.Conn()
	defer nc.Close()
	p := startProcEnv(e, bin, c, "DELAYD_TARGETS_JETSTREAM=fault.>")
	start := time.Now().Add(time.Second)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.Schedule(nc, 3000, start, 6*time.Second, time.Now().Add(30*time.Second))
	}()
	for k := range 3 {
		// One kill in each third of the 6 s delivery window.
		time.Sleep(time.Until(start.Add(time.Duration(k)*2*time.Second + time.Duration(rand.IntN(1500))*time.Millisecond)))
		p.kill()
		t.Logf("kill %d at +%s", k+1, time.Since(start).Round(time.Millisecond))
		p = startProcEnv(e, bin, c, "DELAYD_TARGETS_JETSTREAM=fault.>")
	}
	<-done
	f.Verify(t, 20*time.Second)
}

// TestTenDaemonsThreeKilled: ten daemon processes share one Redis; three
// are killed with SIGKILL mid-run. Everything is delivered, none early,
// duplicates only as redeliveries of leases in flight, and the orphaned
// shards are taken over within the ownership lease.
func TestTenDaemonsThreeKilled(t *testing.T) {
	daemontest.Soak(t, "ten daemon processes, 30,000 envelopes")
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Shards = 16
	c.Scanner.Lease = time.Second
	f := daemontest.NewWorkloadOn(e, "ten.x", e.CaptureStream("TEN", "ten.>"))
	bin := delaydBinary(t)
	procs := make([]*proc, 10)
	for i := range procs {
		procs[i] = startProcEnv(e, bin, c, "DELAYD_NATS_NAME=d"+strconv.Itoa(i), "DELAYD_SHARDS=16")
	}
	st := store.New(store.NewClient(store.Options{Addrs: c.Redis.Addrs}), c.Namespace, c.Shards)
	defer st.Close()
	// Every shard owned, spread over the daemons.
	var owners []string
	distinct := map[string]bool{}
	if !testutil.Eventually(10*time.Second, func() bool {
		var err error
		if owners, err = st.Owners(context.Background()); err != nil {
			t.Fatal(err)
		}
		clear(distinct)
		for _, o := range owners {
			if o != "" {
				distinct[o] = true
			}
		}
		return !slices.Contains(owners, "") && len(distinct) >= 6
	}) {
		t.Fatalf("shards not spread: %v", owners)
	}
	t.Logf("16 shards over %d daemons", len(distinct))
	nc := e.Conn()
	defer nc.Close()
	start := time.Now().Add(2 * time.Second)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.Schedule(nc, 30000, start, 8*time.Second, time.Now().Add(60*time.Second))
	}()
	time.Sleep(time.Until(start.Add(3 * time.Second)))
	for _, i := range []int{1, 4, 7} {
		procs[i].kill()
	}
	killedAt := time.Now()
	if !testutil.Eventually(time.Until(killedAt.Add(2*c.Ownership.TTL+time.Second)), func() bool {
		owners, _ = st.Owners(context.Background())
		return !slices.ContainsFunc(owners, func(o string) bool {
			return o == "" || strings.HasPrefix(o, "d1-") || strings.HasPrefix(o, "d4-") || strings.HasPrefix(o, "d7-")
		})
	}) {
		t.Fatalf("orphaned shards not taken over within the lease: %v", owners)
	}
	t.Logf("orphaned shards taken over %s after the kills (lease TTL %s)", time.Since(killedAt).Round(time.Millisecond), c.Ownership.TTL)
	<-done
	dups := f.Verify(t, 30*time.Second)
	t.Logf("duplicates (redeliveries of leases in flight at the kills): %d", dups)
}

// TestSeriesKill9BetweenPublishAndAck kills the daemon the moment an
// occurrence reaches the target, before it could acknowledge it (its NATS
// traffic from the server comes 300 ms late, so the flush that precedes the
// ack does too): the ack that moves the series to its next occurrence never
// happens. A new daemon must neither skip an occurrence nor deliver one twice
// under the same attempt, and the series must go on.
func TestSeriesKill9BetweenPublishAndAck(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Scanner.Lease = time.Second
	bin := delaydBinary(t)
	nc := e.Conn()
	defer nc.Close()
	st := e.InspectStore(c)

	proxy := testutil.StartProxy(t, fmt.Sprintf("127.0.0.1:%d", e.NATS.Opts.Port))
	slow := c
	slow.NATS.URL = "nats://" + proxy.Addr()
	p := startProc(e, bin, slow)
	proxy.Set(testutil.Down, testutil.Fault{Latency: 300 * time.Millisecond})
	sub1 := e.Conn()
	first := e.Sink(sub1, "series.crash")
	killed := killOnOccurrence(t, sub1, "series.crash", p, 2)
	daemontest.ScheduleOK(t, nc, daemontest.Hdr("Delayd-Target", "series.crash", "Delayd-Every", "1s", "Delayd-Count", "4", "Delayd-Id", "kc"), "k")
	select {
	case <-killed:
	case <-time.After(6 * time.Second):
		t.Fatal("occurrence 2 never arrived")
	}
	_ = p.cmd.Wait()
	if en, err := st.Get(context.Background(), "kc"); err != nil || en.State != store.StateInflight || en.Occurrence != 2 {
		t.Fatalf("after the kill: %+v, %v; want occurrence 2 in flight (the kill missed the window before the ack)", en, err)
	}
	// A subscription made after the kill watches the new daemon: see
	// TestKill9BetweenClaimAndAck for the broker delay this avoids.
	sub1.Close()
	sub2 := e.Conn()
	defer sub2.Close()
	second := e.Sink(sub2, "series.crash")
	startProc(e, bin, c)
	second.WaitFor("kc", 10*time.Second, daemontest.HasOccurrence(4))
	daemontest.Quiet(t, e, c, second)

	a, b := first.Get("kc"), second.Get("kc")
	all := append(append([]daemontest.Delivery(nil), a...), b...)
	byOcc := map[int64][]daemontest.Delivery{}
	for _, d := range all {
		byOcc[d.Occurrence()] = append(byOcc[d.Occurrence()], d)
		if d.Received.Before(d.Due) {
			t.Errorf("occurrence %d attempt %d early", d.Occurrence(), d.Attempt)
		}
	}
	for n := int64(1); n <= 4; n++ {
		ds := byOcc[n]
		if len(ds) == 0 {
			t.Errorf("occurrence %d skipped", n)
			continue
		}
		for i, d := range ds {
			if d.Attempt != i+1 || !d.Due.Equal(ds[0].Due) {
				t.Errorf("occurrence %d delivered again without a higher attempt or with another due time: %s", n, daemontest.Describe(ds))
				break
			}
		}
	}
	if ds := byOcc[2]; len(ds) != 2 {
		t.Errorf("occurrence 2, in flight at the kill: want it delivered again once, as attempt 2: %s", daemontest.Describe(ds))
	}
	if len(byOcc) != 4 {
		t.Errorf("occurrences beyond 1..4: %s", daemontest.Describe(all))
	}
	if !slices.ContainsFunc(b, func(d daemontest.Delivery) bool { return d.Occurrence() == 3 }) || !slices.ContainsFunc(b, func(d daemontest.Delivery) bool { return d.Occurrence() == 4 }) {
		t.Errorf("the series did not go on after the restart: %s", daemontest.Describe(b))
	}
	t.Logf("before the kill:%s\nafter the restart:%s", daemontest.Describe(a), daemontest.Describe(b))
	if n := e.Stored(c); n != 0 {
		t.Errorf("%d envelopes left after the series ended", n)
	}
}

// TestJetStreamCrashBetweenPublishAndAck: the daemon is killed after the
// stream has a message and before the ack reaches Redis; the redelivery
// carries the same Nats-Msg-Id, so the stream keeps one copy.
func TestJetStreamCrashBetweenPublishAndAck(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Scanner.Lease = time.Second
	st := e.Stream("CRASH", "jsc.>")
	bin := delaydBinary(t)
	// Replies from NATS (the PubAcks) reach the daemon 300 ms late, so the
	// kill lands between publish and ack however fast the machine is.
	proxy := testutil.StartProxy(t, fmt.Sprintf("127.0.0.1:%d", e.NATS.Opts.Port))
	slow := c
	slow.NATS.URL = "nats://" + proxy.Addr()
	p := startProcEnv(e, bin, slow, "DELAYD_TARGETS_JETSTREAM=jsc.>")
	proxy.Set(testutil.Down, testutil.Fault{Latency: 300 * time.Millisecond})
	nc := e.Conn()
	defer nc.Close()
	_, seen := killOnFirst(t, nc, "jsc.>", p)
	const n = 300
	// Due once every envelope is stored: the intake's requests reach the
	// daemon 300 ms late through the proxy, and under CI's load 400 ms
	// was not enough (the first delivery killed the daemon while some of
	// the fire-and-forget schedules were still on their way: 175 of 301).
	at := time.Now().Add(3 * time.Second).UTC().Format(time.RFC3339Nano)
	for i := range n {
		m := &nats.Msg{Subject: "delayd.schedule", Header: daemontest.Hdr("Delayd-Target", "jsc.x", "Delayd-At", at, "Delayd-Id", "k"+strconv.Itoa(i))}
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "jsc.x", "Delayd-At", at, "Delayd-Id", "k-last"), ""); err != nil {
		t.Fatal(err)
	}
	if !testutil.Eventually(2*time.Second, func() bool { return e.Stored(c) == n+1 }) {
		t.Fatalf("%d of %d envelopes stored before they fall due", e.Stored(c), n+1)
	}
	_ = p.cmd.Wait()
	s := store.New(store.NewClient(store.Options{Addrs: c.Redis.Addrs}), c.Namespace, c.Shards)
	defer s.Close()
	var inflight int64
	shards, _, _ := s.Stats(context.Background())
	for _, sh := range shards {
		inflight += sh.Counts.Inflight
	}
	if inflight == 0 {
		t.Fatal("kill did not land between publish and ack")
	}
	startProcEnv(e, bin, c, "DELAYD_TARGETS_JETSTREAM=jsc.>")
	testutil.Eventually(10*time.Second, func() bool { return e.Stored(c) == 0 })
	if left := e.Stored(c); left != 0 {
		t.Fatalf("%d envelopes not delivered after restart", left)
	}
	if got := daemontest.StreamMsgs(t, st); got != n+1 {
		t.Fatalf("stream holds %d messages, want exactly %d (one per envelope)", got, n+1)
	}
	t.Logf("%d claimed at the kill; %d core copies seen, stream kept %d", inflight, seen.Load(), n+1)
}

// killOnOccurrence subscribes to subject and kills p with SIGKILL when
// occurrence k arrives, before the daemon can acknowledge it, most times.
func killOnOccurrence(t *testing.T, nc *nats.Conn, subject string, p *proc, k int64) <-chan struct{} {
	t.Helper()
	killed := make(chan struct{})
	if _, err := nc.Subscribe(subject, func(m *nats.Msg) {
		if m.Header.Get(envelope.HeaderOccurrence) == strconv.FormatInt(k, 10) {
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			select {
			case <-killed:
			default:
				close(killed)
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return killed
}
