package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// TestChaosSoak runs schedules, replaces and cancels through three daemon
// processes while a seeded nemesis kills (-9) and pauses daemons, restarts
// and pauses Redis (AOF, appendfsync always), restarts NATS (with a core
// consumer that reconnects after delayd), slows or cuts daemons' Redis
// links, cuts one daemon's NATS path while its Redis path stays,
// blackholes one (no byte passes, both sockets stay open), and sends the
// core consumer away. Most deliveries go to a JetStream stream, which
// keeps every one across the faults; a quarter go to a core NATS subject,
// whose consumer records each it receives; one in 200 carries a
// 256 kB payload, and daemon 0 runs under a 96 MiB memory limit. Then it
// checks:
//   - every acknowledged, uncancelled envelope was delivered at least once;
//   - nothing was early;
//   - everything delivered had been acknowledged (or answered 504);
//   - every duplicate carries an attempt number not seen before for it
//     (a higher one, or an earlier attempt's copy held by a paused daemon
//     and sent late), or its request was resent after a failure (a
//     documented upsert), or its first copy arrived while a daemon's path
//     was blackholed (a batch that reached NATS before the silence, put
//     back uncounted: documented).
//
// It runs with DELAYD_SOAK=1 (.ci/run's second step), for 60 s;
// DELAYD_CHAOS_DURATION runs longer, DELAYD_CHAOS_SEED repeats a run's
// nemesis.
func TestChaosSoak(t *testing.T) {
	daemontest.Soak(t, "a 60 s chaos soak")
	t.Parallel()
	dur, seed, rng := soakParams(t)
	e := daemontest.NewEnv(t, "--appendonly", "yes", "--appendfsync", "always")
	stream := chaosStream(t, e.Conn(), 1)
	bin := delaydBinary(t)
	const daemons = 3
	c := e.Config()
	c.Scanner.Lease = time.Second
	extra := []string{"DELAYD_TARGETS_JETSTREAM=chaos.>", "DELAYD_SCANNER_MAX_ATTEMPTS=1000",
		"DELAYD_SCANNER_RETRY_BACKOFF=100ms", "DELAYD_UI_ENABLED=false"}
	proxies := make([]*testutil.Proxy, daemons)
	natsProxies := make([]*testutil.Proxy, daemons)
	procs := make([]*proc, daemons)
	start := func(i int) {
		ci := c
		ci.Redis.Addrs = []string{proxies[i].Addr()}
		ci.NATS.URL = "nats://" + natsProxies[i].Addr()
		env := extra
		if i == 0 {
			env = append(slices.Clone(extra), "GOMEMLIMIT=96MiB")
		}
		procs[i] = startProcEnv(e, bin, ci, env...)
	}
	for i := range daemons {
		proxies[i] = testutil.StartProxy(t, e.Redis.Addr)
		natsProxies[i] = testutil.StartProxy(t, fmt.Sprintf("127.0.0.1:%d", e.NATS.Opts.Port))
		start(i)
	}
	consumer := startChaosConsumer(t, e.NATS.URL())
	nc := e.Conn()
	defer nc.Close()
	ctx, stop := context.WithTimeout(context.Background(), dur)
	defer stop()
	w, wg := startChaosWorkload(ctx, nc, seed)

	// The nemesis: one fault at a time, every 2-5 s, healed before the next.
	faults := map[string]int{}
	for ctx.Err() == nil {
		if !sleepCtxT(ctx, time.Duration(2000+rng.IntN(3000))*time.Millisecond) {
			break
		}
		hold := time.Duration(300+rng.IntN(1700)) * time.Millisecond
		i := rng.IntN(daemons)
		switch k := rng.IntN(10); k {
		case 0:
			faults["kill -9 daemon"]++
			procs[i].kill()
			time.Sleep(hold)
			start(i)
		case 1:
			faults["pause daemon"]++
			_ = procs[i].cmd.Process.Signal(syscall.SIGSTOP)
			time.Sleep(hold)
			_ = procs[i].cmd.Process.Signal(syscall.SIGCONT)
		case 2:
			faults["restart Redis"]++
			e.Redis.Kill()
			time.Sleep(hold)
			e.Redis.Start()
		case 3:
			faults["pause Redis"]++
			e.Redis.Pause()
			time.Sleep(hold)
			e.Redis.Resume()
		case 4:
			faults["restart NATS"]++
			e.NATS.Stop()
			time.Sleep(hold)
			e.NATS.Start()
		case 5:
			faults["slow Redis link"]++
			proxies[i].Set(testutil.Down, testutil.Fault{Latency: 300 * time.Millisecond})
			time.Sleep(hold)
			proxies[i].Clear()
		case 6:
			faults["cut Redis link"]++
			proxies[i].Set(testutil.Up, testutil.Fault{CutAfter: 1 + rng.IntN(2000)})
			time.Sleep(hold)
			proxies[i].Clear()
		case 7:
			// Long enough for the daemon to give its shards up (two
			// ownership rounds) and the others to take them.
			faults["cut a daemon's NATS path"]++
			natsProxies[i].Set(testutil.Up, testutil.Fault{CutAfter: 1})
			natsProxies[i].Set(testutil.Down, testutil.Fault{CutAfter: 1})
			natsProxies[i].Cut()
			time.Sleep(hold + time.Second)
			natsProxies[i].Clear()
		case 8:
			faults["core consumer away"]++
			consumer.away(hold + time.Second)
		case 9:
			// Long enough for the daemon to find the path silent and give
			// its shards up; then what the proxy held goes on.
			faults["blackhole a daemon's NATS path"]++
			from := time.Now()
			natsProxies[i].Blackhole()
			time.Sleep(hold + 2*time.Second)
			natsProxies[i].Clear()
			w.mu.Lock()
			w.blackholes = append(w.blackholes, span{from, time.Now()})
			w.mu.Unlock()
		}
	}
	wg.Wait()
	w.settle(stream, consumer)
	w.check(t, stream, consumer.received(), faults)
	if peak := peakRSS(t, procs[0].cmd.Process.Pid); peak > 96<<20 {
		t.Errorf("daemon 0 peaked at %d MiB RSS under its 96 MiB limit", peak>>20)
	} else {
		t.Logf("daemon 0 (GOMEMLIMIT=96MiB) peak RSS %d MiB", peak>>20)
	}
}

// chaosConsumer subscribes to the core target on a connection of its own
// that reconnects only 3 s after a NATS restart (well after delayd), and
// records each delivery it receives.
type chaosConsumer struct {
	t   *testing.T
	nc  *nats.Conn
	mu  sync.Mutex
	sub *nats.Subscription
	got []chaosDelivery
}

// chaosDelivery is one delivery seen, from the stream or the consumer.
type chaosDelivery struct {
	id, due, attempt string
	at               time.Time
}

func startChaosConsumer(t *testing.T, url string) *chaosConsumer {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(3*time.Second), nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c := &chaosConsumer{t: t, nc: nc}
	c.subscribe()
	return c
}

func (c *chaosConsumer) subscribe() {
	sub, err := c.nc.Subscribe("core.t", func(m *nats.Msg) {
		d := chaosDelivery{id: m.Header.Get("Delayd-Id"), due: m.Header.Get("Delayd-Due"),
			attempt: m.Header.Get("Delayd-Attempt"), at: time.Now()}
		c.mu.Lock()
		c.got = append(c.got, d)
		c.mu.Unlock()
	})
	if err != nil {
		c.t.Errorf("core consumer: %v", err)
		return
	}
	c.mu.Lock()
	c.sub = sub
	c.mu.Unlock()
}

// away unsubscribes for d: deliveries meanwhile find nobody and must be
// retried.
func (c *chaosConsumer) away(d time.Duration) {
	c.mu.Lock()
	sub := c.sub
	c.mu.Unlock()
	_ = sub.Unsubscribe()
	time.Sleep(d)
	c.subscribe()
}

func (c *chaosConsumer) received() []chaosDelivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got)
}

// chaosStream is the stream deliveries land in, with the given replicas,
// on nc (closed with the test). Its duplicate window is the server's
// minimum, so the check sees redeliveries instead of JetStream dropping
// them.
func chaosStream(t *testing.T, nc *nats.Conn, replicas int) jetstream.Stream {
	t.Helper()
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// A cluster that just elected its meta leader may not yet know every
	// peer online: an R3 stream waits for them (JetStream's 10005, no
	// suitable peers for placement).
	var s jetstream.Stream
	testutil.Eventually(20*time.Second, func() bool {
		s, err = js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "CHAOS", Subjects: []string{"chaos.>"},
			Duplicates: 100 * time.Millisecond, Storage: jetstream.FileStorage, Replicas: replicas})
		var api *jetstream.APIError
		return err == nil || !errors.As(err, &api) || api.ErrorCode != 10005
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// soakParams reads a soak's duration (60 s, or DELAYD_CHAOS_DURATION) and
// its nemesis seed (random, or DELAYD_CHAOS_SEED), and logs both.
func soakParams(t *testing.T) (time.Duration, uint64, *rand.Rand) {
	t.Helper()
	dur := 60 * time.Second
	if v := os.Getenv("DELAYD_CHAOS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		dur = d
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("DELAYD_CHAOS_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("chaos seed %d (DELAYD_CHAOS_SEED=%d reruns this nemesis), duration %s", seed, seed, dur)
	return dur, seed, rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// startChaosWorkload runs four workers on nc until ctx ends.
func startChaosWorkload(ctx context.Context, nc *nats.Conn, seed uint64) (*chaosWorkload, *sync.WaitGroup) {
	w := &chaosWorkload{acked: map[string]time.Time{}, unknown: map[string]bool{}, cancelled: map[string]time.Time{},
		uncertain: map[string]bool{}, resent: map[string]bool{}, busy: map[string]bool{}}
	var wg sync.WaitGroup
	for worker := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(ctx, nc, rand.New(rand.NewPCG(seed+uint64(worker)+1, 7)), worker)
		}()
	}
	return w, &wg
}

// settle waits, after the workload stopped, until everything acknowledged
// could have arrived: it is all due within 5 s of the end.
func (w *chaosWorkload) settle(stream jetstream.Stream, consumer *chaosConsumer) {
	w.mu.Lock()
	acked, lastDue := len(w.acked), w.lastDue
	w.mu.Unlock()
	testutil.Eventually(30*time.Second, func() bool {
		info, err := stream.Info(context.Background())
		return err == nil && info.State.Msgs+uint64(len(consumer.received())) >= uint64(acked) &&
			time.Now().After(lastDue.Add(3*time.Second))
	})
}

// span is a time window of a fault.
type span struct{ from, to time.Time }

// within reports whether t falls in one of spans, widened by slack.
func within(spans []span, t time.Time, before, after time.Duration) bool {
	for _, s := range spans {
		if !t.Before(s.from.Add(-before)) && !t.After(s.to.Add(after)) {
			return true
		}
	}
	return false
}

type chaosWorkload struct {
	mu        sync.Mutex
	n         int
	acked     map[string]time.Time // id → requested due of its last acknowledged version
	unknown   map[string]bool      // answered 504 or timed out, and never acknowledged since
	cancelled map[string]time.Time // cancel confirmed (not in flight, well before due) at

	uncertain map[string]bool // a replace or cancel whose outcome is unknown
	resent    map[string]bool // sent again after a failed request
	busy      map[string]bool // a request for it is being sent or retried
	lastDue   time.Time
	replaced  int
	// lagging are the windows of the failovers with a lagging replica:
	// from the replica's stop to a second after the master's kill. A
	// duplicate with the same attempt number is allowed only when its
	// first copy arrived in one (a claim published with a short wait,
	// then lost with the master: the one documented repeat).
	lagging []span
	// nodeKills are the windows of the NATS node kills, from the stop to
	// the restart. A core delivery may be lost only when it fell due in
	// one (give or take the retries' backoff): a message forwarded over a
	// route to a node that dies is gone, and no status tells delayd.
	nodeKills []span
	// blackholes are the windows a daemon's NATS path was blackholed. A
	// duplicate with the same attempt number is allowed when its first
	// copy arrived in one (or 2 s after): a batch that reached NATS just
	// before the silence is put back uncounted and delivered again.
	blackholes []span
}

// run sends schedules (new and replacing) and cancels until ctx ends.
func (w *chaosWorkload) run(ctx context.Context, nc *nats.Conn, rng *rand.Rand, worker int) {
	for ctx.Err() == nil {
		time.Sleep(time.Duration(2+rng.IntN(6)) * time.Millisecond)
		w.mu.Lock()
		var victim string
		if r := rng.IntN(10); r < 3 {
			// A replace or cancel of an envelope due more than 2 s ahead:
			// it cannot be in flight yet. Not one with a request still
			// being retried, nor one whose earlier request timed out (a
			// timed-out request may still be applied later: documented).
			for id, at := range w.acked {
				if _, gone := w.cancelled[id]; !gone && !w.uncertain[id] && !w.busy[id] && !w.resent[id] &&
					time.Until(at) > 2*time.Second {
					victim = id
					break
				}
			}
		}
		if victim != "" {
			w.busy[victim] = true
		}
		w.n++
		id := fmt.Sprintf("c%d-%d", worker, w.n)
		w.mu.Unlock()
		at := time.Now().Add(time.Duration(500+rng.IntN(4500)) * time.Millisecond)
		switch {
		case victim != "" && rng.IntN(2) == 0:
			w.cancel(nc, victim)
		case victim != "":
			w.schedule(ctx, nc, victim, at, true)
		default:
			w.schedule(ctx, nc, id, at, false)
		}
		if victim != "" {
			w.mu.Lock()
			delete(w.busy, victim)
			w.mu.Unlock()
		}
	}
}

// resendFor is how long past an envelope's due time the workload keeps
// resending a request that failed (504, a timeout), as a client that
// retries until it hears back does: a resend after the delivery is
// answered from the id's tombstone (intake.dedupe_window), not scheduled
// again.
const resendFor = 5 * time.Second

func (w *chaosWorkload) schedule(ctx context.Context, nc *nats.Conn, id string, at time.Time, replace bool) {
	for try := 0; ; try++ {
		if try > 0 && (ctx.Err() != nil || time.Now().After(at.Add(resendFor))) {
			// Gave up: whether it is stored is unknown.
			w.mu.Lock()
			if replace {
				w.uncertain[id] = true
			} else {
				w.unknown[id] = true
			}
			w.mu.Unlock()
			return
		}
		target, data := chaosTarget(id)
		m := &nats.Msg{Subject: "delayd.schedule", Data: data,
			Header: daemontest.Hdr("Delayd-Target", target, "Delayd-Id", id, "Delayd-At", at.UTC().Format(time.RFC3339Nano))}
		rep, err := nc.RequestMsg(m, 2*time.Second)
		if err == nil && rep.Header.Get(micro.ErrorHeader) == "" {
			w.mu.Lock()
			w.acked[id] = at
			delete(w.unknown, id)
			if try > 0 {
				w.resent[id] = true
			}
			if replace {
				w.replaced++
			}
			if at.After(w.lastDue) {
				w.lastDue = at
			}
			w.mu.Unlock()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// chaosTarget picks an id's target and payload from the id, so a replace
// keeps them: a quarter go to the core subject, one in 200 carries 256 kB.
func chaosTarget(id string) (string, []byte) {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	n := h.Sum32()
	target, data := "chaos.t", []byte(id)
	if n%4 == 0 {
		target = "core.t"
	}
	if n%200 == 1 {
		data = append(data, make([]byte, 256<<10)...)
	}
	return target, data
}

func (w *chaosWorkload) cancel(nc *nats.Conn, id string) {
	m := &nats.Msg{Subject: "delayd.cancel", Header: daemontest.Hdr("Delayd-Id", id)}
	sent := time.Now()
	rep, err := nc.RequestMsg(m, 2*time.Second)
	w.mu.Lock()
	defer w.mu.Unlock()
	var r struct {
		Cancelled bool `json:"cancelled"`
		InFlight  bool `json:"in_flight"`
	}
	if err != nil || rep.Header.Get(micro.ErrorHeader) != "" || json.Unmarshal(rep.Data, &r) != nil || !r.Cancelled || r.InFlight {
		w.uncertain[id] = true
		return
	}
	w.cancelled[id] = sent
}

// check reads every delivery from the stream, adds those the core
// consumer received, and verifies the guarantees.
func (w *chaosWorkload) check(t *testing.T, stream jetstream.Stream, core []chaosDelivery, faults map[string]int) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	info, err := stream.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	type seen struct {
		attempts []int
		first    map[int]time.Time // attempt → arrival of its first copy
	}
	got := map[string]*seen{}
	dupRedelivery, dupResent, dupRepeat, dupLate, dupSilent := 0, 0, 0, 0, 0
	var lateness []time.Duration
	all := core
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatalf("get msg %d: %v", seq, err)
		}
		all = append(all, chaosDelivery{id: m.Header.Get("Delayd-Id"), due: m.Header.Get("Delayd-Due"),
			attempt: m.Header.Get("Delayd-Attempt"), at: m.Time})
	}
	slices.SortStableFunc(all, func(a, b chaosDelivery) int { return a.at.Compare(b.at) })
	for _, m := range all {
		id := m.id
		due, _ := time.Parse(time.RFC3339Nano, m.due)
		attempt, _ := strconv.Atoi(m.attempt)
		if m.at.Before(due) {
			t.Errorf("%s received %s before its due time", id, due.Sub(m.at))
		}
		if _, ok := w.acked[id]; !ok && !w.unknown[id] {
			t.Errorf("%s delivered but never acknowledged", id)
		}
		// An earlier version may have been delivered before a replace and
		// the cancel; nothing may arrive after the cancel was sent.
		if at, ok := w.cancelled[id]; ok && m.at.After(at) {
			t.Errorf("%s delivered %s after a confirmed cancel", id, m.at.Sub(at))
		}
		s := got[id]
		if s == nil {
			s = &seen{first: map[int]time.Time{}}
			got[id] = s
			lateness = append(lateness, m.at.Sub(due))
		} else {
			switch {
			case attempt > slices.Max(s.attempts):
				dupRedelivery++
			case !slices.Contains(s.attempts, attempt):
				// An earlier attempt's copy after a later one: a daemon
				// frozen (paused) between its publish deadline check and
				// the socket write sends it after the lease expired and
				// another daemon redelivered. Each copy still has its own
				// attempt number (documented).
				dupLate++
			case w.resent[id] || w.uncertain[id] || w.unknown[id]:
				dupResent++
			case within(w.lagging, s.first[attempt], 0, 0):
				dupRepeat++
			case within(w.blackholes, s.first[attempt], 0, 2*time.Second):
				dupSilent++
			default:
				t.Errorf("%s: duplicate with attempt %d after attempts %v", id, attempt, s.attempts)
			}
		}
		s.attempts = append(s.attempts, attempt)
		if _, ok := s.first[attempt]; !ok {
			s.first[attempt] = m.at
		}
	}
	lost, coreLost := 0, 0
	for id := range w.acked {
		if _, gone := w.cancelled[id]; !gone && !w.uncertain[id] && got[id] == nil {
			// Its first try is at its due time; retries (no subscriber)
			// follow within the backoff.
			if target, _ := chaosTarget(id); target == "core.t" && within(w.nodeKills, w.acked[id], 10*time.Second, 2*time.Second) {
				coreLost++
				continue
			}
			lost++
			t.Errorf("%s acknowledged and never delivered", id)
		}
	}
	slices.Sort(lateness)
	p50, p99 := time.Duration(0), time.Duration(0)
	if len(lateness) > 0 {
		p50, p99 = lateness[len(lateness)/2], lateness[len(lateness)*99/100]
	}
	total := 0
	for _, n := range faults {
		total += n
	}
	t.Logf("chaos: %d acknowledged (%d replaced, %d cancelled, %d unknown outcomes, %d uncertain), %d delivered; "+
		"faults %d %v; lost %d (and %d core NATS deliveries lost across a NATS node kill); duplicates: %d redeliveries with a higher attempt, %d after a resent request, "+
		"%d with the same attempt after a failover with a lagging replica, %d with the same attempt around a blackholed path, %d earlier attempts arriving after a later one; lateness p50 %s p99 %s",
		len(w.acked), w.replaced, len(w.cancelled), len(w.unknown), len(w.uncertain), len(got), total, faults, lost, coreLost,
		dupRedelivery, dupResent, dupRepeat, dupSilent, dupLate, p50, p99)
}

func sleepCtxT(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
