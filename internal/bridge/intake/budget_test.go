package intake

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// instantStore answers every write at once, as if Redis took no time: the
// intake's own cost without the Redis round trip.
type instantStore struct{}

func (instantStore) Schedule(_ context.Context, items []store.Item) ([]store.Scheduled, []error) {
	due, errs := make([]store.Scheduled, len(items)), make([]error, len(items))
	for i := range due {
		due[i] = store.Scheduled{Kind: store.Stored, DueMs: time.Now().Add(time.Hour).UnixMilli()}
	}
	return due, errs
}
func (instantStore) Cancel(context.Context, string) (store.Cancelled, error) {
	return store.Cancelled{}, nil
}
func (instantStore) Shard(string) int { return 0 }

// noInspect serves no inspection (the benchmark calls none).
type noInspect struct{}

var errNoInspect = fmt.Errorf("no inspection in this benchmark")

func (noInspect) Get(context.Context, string) (store.Entry, error) {
	return store.Entry{}, errNoInspect
}
func (noInspect) List(context.Context, store.ListOptions) ([]store.Entry, store.Cursor, bool, error) {
	return nil, store.Cursor{}, false, errNoInspect
}
func (noInspect) Stats(context.Context, ...int) ([]store.ShardStats, int64, error) {
	return nil, 0, errNoInspect
}
func (noInspect) Replay(context.Context, []string) (int, error) { return 0, errNoInspect }
func (noInspect) Purge(context.Context, []string) (int, error)  { return 0, errNoInspect }

// stageTimes collects when each request reached each stage: "sent" and
// "received" at the requester, the others inside the intake (its trace
// hook), and reports the median time between consecutive stages.
type stageTimes struct {
	mu sync.Mutex
	at map[string]map[string]time.Time // id → stage → when
}

func (s *stageTimes) record(id, stage string, at time.Time) {
	s.mu.Lock()
	if s.at[id] == nil {
		s.at[id] = map[string]time.Time{}
	}
	s.at[id][stage] = at
	s.mu.Unlock()
}

func (s *stageTimes) reset() {
	s.mu.Lock()
	s.at = map[string]map[string]time.Time{}
	s.mu.Unlock()
}

// budgetStages are the stages in order, each named for the step that ends
// there.
var budgetStages = []struct{ from, to, name string }{
	{"sent", "handler", "nats-in"},      // request published → the handler runs
	{"handler", "queued", "validate"},   // headers parsed, id made, bytes held
	{"queued", "flush", "handoff"},      // waiting for a batch and a flusher
	{"flush", "stored", "redis"},        // the batch's script call
	{"stored", "replied", "reply"},      // JSON and publish of the reply
	{"replied", "received", "nats-out"}, // reply published → requester has it
}

func (s *stageTimes) report(b *testing.B) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range budgetStages {
		var ds []time.Duration
		for _, at := range s.at {
			from, ok1 := at[st.from]
			to, ok2 := at[st.to]
			if ok1 && ok2 {
				ds = append(ds, to.Sub(from))
			}
		}
		if len(ds) == 0 {
			continue
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		var sum time.Duration
		for _, d := range ds {
			sum += d
		}
		b.ReportMetric(float64(sum.Nanoseconds())/1e3/float64(len(ds)), "µs-"+st.name)
		b.ReportMetric(float64(ds[len(ds)*9/10].Nanoseconds())/1e3, "µs-p90-"+st.name)
	}
}

// BenchmarkScheduleCall is the latency budget of one schedule call: the
// same request/reply, from `concurrency` requesters, answered by
//   - echo: a bare responder (the NATS round trip);
//   - intake-instant: the real intake over a store that answers at once
//     (what delayd adds besides Redis);
//   - intake-redis: the real intake and store on a real redis-server.
//
// Each reports µs per call (the latency each requester sees) and, for the
// intakes, the mean and p90 time of each stage of a request inside
// delayd.
//
//	go test -run xxx -bench ScheduleCall -benchtime 5000x ./internal/bridge
//
// With external servers, it also says where the CPU of a call goes:
// DELAYD_BENCH_NATS_URL and DELAYD_BENCH_REDIS name a nats-server and a
// redis-server of the bench's own (the Redis is flushed), and
// DELAYD_BENCH_PIDS ("nats=PID,redis=PID") their processes: each run then
// reports the CPU µs per call of each, and of this process (the
// requesters and the intake).
func BenchmarkScheduleCall(b *testing.B) {
	ns := benchNATS(b)
	r := testutil.StartRedis
	var rs *testutil.Redis
	if addr := os.Getenv("DELAYD_BENCH_REDIS"); addr != "" {
		rs = testutil.ExternalRedis(b, addr)
		if err := rs.Client().FlushAll(context.Background()).Err(); err != nil {
			b.Fatal(err)
		}
	} else {
		rs = r(b)
	}
	pids := benchPIDs(b)
	st := store.New(store.NewClient(store.Options{Addrs: []string{rs.Addr}}), "budget", 16)
	b.Cleanup(func() { st.Close() })

	echo, err := nats.Connect(ns)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(echo.Close)
	if _, err := echo.Subscribe("echo.schedule", func(m *nats.Msg) { _ = m.Respond([]byte(`{"id":"x"}`)) }); err != nil {
		b.Fatal(err)
	}
	// microecho: a micro endpoint answering in its handler; handoff: a
	// plain subscription whose reply another goroutine sends (the
	// intake's shape without its work).
	svc, err := micro.AddService(echo, micro.Config{Name: "echo", Version: "0.0.0"})
	if err != nil {
		b.Fatal(err)
	}
	if err := svc.AddGroup("microecho").AddEndpoint("schedule", micro.HandlerFunc(func(r micro.Request) {
		_ = r.Respond([]byte(`{"id":"x"}`))
	})); err != nil {
		b.Fatal(err)
	}
	handoff := make(chan *nats.Msg, 1024)
	go func() {
		for m := range handoff {
			_ = m.Respond([]byte(`{"id":"x"}`))
		}
	}()
	b.Cleanup(func() { close(handoff) })
	if _, err := echo.Subscribe("handoff.schedule", func(m *nats.Msg) { handoff <- m }); err != nil {
		b.Fatal(err)
	}
	traces := map[string]*stageTimes{}
	for _, v := range []struct {
		prefix string
		st     Store
	}{{"instant", instantStore{}}, {"redis", st}, {"untraced", st}} {
		nc, err := nats.Connect(ns)
		if err != nil {
			b.Fatal(err)
		}
		// untraced is redis without the trace hook, whose map and mutex
		// cost CPU of their own: its CPU columns are the honest ones.
		var trace func(id, stage string, at time.Time)
		if v.prefix != "untraced" {
			tr := &stageTimes{}
			tr.reset()
			traces[v.prefix] = tr
			trace = tr.record
		}
		in := NewIntake(nc, v.st, noInspect{}, noWake{}, nil, IntakeOptions{Options: Options{Subject: v.prefix, Batch: 256, storeTimeout: 5 * time.Second, Limits: envelope.Limits{MaxPayload: 1 << 20, MaxIDLen: 256, MaxHeaders: 64, MaxHeaderBytes: 16 << 10, MaxDelay: 24 * time.Hour}},
			Version: "0.0.0", trace: trace}, hclog.NewNullLogger())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- in.Run(ctx) }()
		b.Cleanup(func() { cancel(); <-done })
	}
	payload := []byte(strings.Repeat("p", 128))
	for _, concurrency := range []int{1, 64, 256} {
		for _, target := range []string{"echo", "microecho", "handoff", "instant", "redis", "untraced"} {
			b.Run(fmt.Sprintf("%s/requesters=%d", target, concurrency), func(b *testing.B) {
				conns := make([]*nats.Conn, concurrency)
				for i := range conns {
					nc, err := nats.Connect(ns)
					if err != nil {
						b.Fatal(err)
					}
					defer nc.Close()
					conns[i] = nc
				}
				// Warm up every path before timing.
				try := func(nc *nats.Conn, i int) error {
					m := &nats.Msg{Subject: target + ".schedule", Data: payload, Header: nats.Header{
						envelope.HeaderTarget: {"budget.t"}, envelope.HeaderDelay: {"1h"},
						envelope.HeaderID: {fmt.Sprintf("b%d", i)}}}
					tr := traces[target]
					if tr != nil {
						tr.record(m.Header.Get(envelope.HeaderID), "sent", time.Now())
					}
					rep, err := nc.RequestMsg(m, 5*time.Second)
					if tr != nil {
						tr.record(m.Header.Get(envelope.HeaderID), "received", time.Now())
					}
					if err == nil && rep.Header.Get("Nats-Service-Error") != "" {
						err = fmt.Errorf("%s", rep.Header.Get("Nats-Service-Error"))
					}
					return err
				}
				call := func(nc *nats.Conn, i int) {
					if err := try(nc, i); err != nil {
						b.Errorf("%s: %v", target, err)
					}
				}
				// Until the service is up, then warm every path up.
				for deadline := time.Now().Add(10 * time.Second); try(conns[0], 0) != nil; time.Sleep(10 * time.Millisecond) {
					if time.Now().After(deadline) {
						b.Fatalf("%s does not answer", target)
					}
				}
				for i := range 100 {
					call(conns[0], i)
				}
				if tr := traces[target]; tr != nil {
					tr.reset()
				}
				rc := rs.Client()
				if target == "redis" || target == "untraced" {
					if err := rc.ConfigResetStat(context.Background()).Err(); err != nil {
						b.Fatal(err)
					}
				}
				cpu0 := cpuTimes(pids)
				b.ResetTimer()
				var wg sync.WaitGroup
				per := b.N / concurrency
				for w := range concurrency {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := range per {
							call(conns[w], w*per+i)
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(max(per, 1)), "µs/call")
				if pids != nil {
					cpu1 := cpuTimes(pids)
					for name, t := range cpu1 {
						b.ReportMetric(float64((t-cpu0[name]).Microseconds())/float64(per*concurrency), "cpu-µs-"+name)
					}
				}
				if tr := traces[target]; tr != nil {
					tr.report(b)
				}
				if target == "redis" || target == "untraced" {
					// Redis' own time in the schedule script, per call: a
					// function of the library, or a script where the
					// server has no functions.
					stats := rc.Info(context.Background(), "commandstats").Val()
					for _, line := range strings.Split(stats, "\r\n") {
						rest, ok := strings.CutPrefix(line, "cmdstat_fcall:")
						if !ok {
							rest, ok = strings.CutPrefix(line, "cmdstat_evalsha:")
						}
						if ok {
							for _, kv := range strings.Split(rest, ",") {
								if v, ok := strings.CutPrefix(kv, "usec_per_call="); ok {
									f, _ := strconv.ParseFloat(v, 64)
									b.ReportMetric(f, "µs-in-redis-script")
								}
							}
						}
					}
				}
			})
		}
	}
}

// benchNATS is the NATS URL of the benchmark: DELAYD_BENCH_NATS_URL, or an
// in-process server.
func benchNATS(b *testing.B) string {
	if url := os.Getenv("DELAYD_BENCH_NATS_URL"); url != "" {
		return url
	}
	return testutil.StartNATS(b).URL()
}

// benchPIDs reads DELAYD_BENCH_PIDS ("nats=PID,redis=PID"), or nil.
func benchPIDs(b *testing.B) map[string]int {
	v := os.Getenv("DELAYD_BENCH_PIDS")
	if v == "" {
		return nil
	}
	pids := map[string]int{"self": os.Getpid()}
	for _, kv := range strings.Split(v, ",") {
		name, pid, ok := strings.Cut(kv, "=")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil {
			b.Fatalf("DELAYD_BENCH_PIDS: %q is not name=pid", kv)
		}
		pids[name] = n
	}
	return pids
}

// cpuTimes reads the user+system CPU time of each process from /proc.
func cpuTimes(pids map[string]int) map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// Fields after the command (which may hold spaces) in parentheses:
		// utime and stime are the 12th and 13th of them, in clock ticks.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		stt, _ := strconv.ParseInt(f[12], 10, 64)
		out[name] = time.Duration(ut+stt) * 10 * time.Millisecond // USER_HZ is 100
	}
	return out
}
