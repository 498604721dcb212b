package bench

import (
	"bytes"
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// The progress reporter's stop returns only once the reporter wrote its
// last line, so the bench may write to the same writer after it. Before,
// stop only signalled the reporter: its final newline raced the next
// header (the race detector failed TestBenchStreamCompare and every test
// running beside it in one CI run).
func TestReportStopJoinsTheReporter(t *testing.T) {
	t.Parallel()
	for range 20 {
		var out bytes.Buffer // not safe for concurrent writes: -race sees one
		var scheduled atomic.Int64
		stop := startReport(&out, 10, &scheduled, newRecorder(10))
		stop()
		if out.String() != "\n" {
			t.Fatalf("after stop, the writer holds %q, want the reporter's last newline", out.String())
		}
		out.WriteString("next")
		stop() // a second stop is harmless
	}
}

// Two failed requests whose errors are of different types (a refusal
// and a timeout) are counted, and the first is reported. With an
// atomic.Value, the second CompareAndSwap panicked ("inconsistently typed
// value"), which a run with both a timeout and a refusal would hit.
func TestFirstRejectionOfTwoErrorTypes(t *testing.T) {
	t.Parallel()
	nc := connect(t, testutil.StartNATS(t).URL())
	// A delayd that refuses the first schedule (a service error) and
	// never answers the second (a timeout).
	var calls atomic.Int64
	sub, err := nc.Subscribe("fake.schedule", func(m *nats.Msg) {
		if calls.Add(1) == 1 {
			r := nats.NewMsg(m.Reply)
			r.Header.Set("Nats-Service-Error", "target not allowed")
			r.Header.Set("Nats-Service-Error-Code", "403")
			_ = m.RespondMsg(r)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	w := Workload{Count: 2, Concurrency: 1, Window: time.Second, Target: "t", Timeout: 300 * time.Millisecond}
	_, rejected, first, err := schedule(context.Background(), []*conn{newConn(nc, "fake")}, w, sendMode{}, "x", time.Now(), nil)
	if err == nil || rejected != 2 {
		t.Fatalf("rejected %d of 2, err %v", rejected, err)
	}
	if !strings.Contains(first, "target not allowed") {
		t.Fatalf("first rejection %q, want the refusal", first)
	}
}

// A full window of async publishes waits for room, for longer than
// nats.go's 200 ms default. Before, a publish that met a window full for
// 200 ms failed without being sent, and the bench counted it as refused
// ("rejected 1" in two stream runs on a loaded machine). Here a stream
// stand-in acknowledges each publish 500 ms late: the slow server is the
// point of the test.
func TestPublishAsyncWaitsForRoomInItsWindow(t *testing.T) {
	t.Parallel()
	nc := connect(t, testutil.StartNATS(t).URL())
	var seq atomic.Int64
	sub, err := nc.Subscribe("slow.>", func(m *nats.Msg) {
		go func() {
			time.Sleep(500 * time.Millisecond)
			_ = m.Respond([]byte(`{"stream":"SLOW","seq":` + strconv.FormatInt(seq.Add(1), 10) + `}`))
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	_, failed, first, err := newConn(nc, "delayd").publishAsync(context.Background(), 3, 1,
		func(int) outgoing { return outgoing{Subject: "slow.x"} }, nil)
	if err != nil || failed != 0 {
		t.Fatalf("%d of 3 publishes failed with a full window (first: %v), err %v", failed, first, err)
	}
}

// ownsKey refuses, in any case and spacing, every key the bench sets for
// its child: one of them could make the bench load, and then clean up, a
// real deployment (its namespace, stream or subject, its Redis).
func TestCheckChildSet(t *testing.T) {
	t.Parallel()
	refused := []string{"subject=delayd", " Subject =x", "namespace=prod", "intake.stream.enabled=true",
		"intake.stream.name=DELAYD_INTAKE", "nats.url=nats://prod:4222", "embedded=false",
		"redis.addrs=10.0.0.1:6379", "redis.db=1", "redis.cluster=true", "redis.master_name=m",
		"redis.username=u", "redis.password=p", "redis.tls.ca_file=x", "REDIS.TLS.enabled=true"}
	for _, kv := range refused {
		if err := CheckChildSet([]string{"scanner.claim_batch=8", kv}); err == nil || !strings.Contains(err.Error(), "the bench sets it itself") {
			t.Errorf("--child-set %s: %v", kv, err)
		}
	}
	if err := CheckChildSet([]string{"novalue"}); err == nil || !strings.Contains(err.Error(), "want KEY=VALUE") {
		t.Errorf("--child-set without =: %v", err)
	}
	if err := CheckChildSet([]string{"scanner.claim_batch=8", "targets.fire_and_forget=bench.>", "redis.wait_replicas=1"}); err != nil {
		t.Errorf("keys the bench leaves alone: %v", err)
	}
}

// The child reads the bench's own --config and --set first, then the
// bench's settings that keep it apart (which win over them), then
// --child-set. Before, it read none of the bench's config: with --set
// redis.db=3 it wrote to db 0 and the bench cleaned up db 3.
func TestChildArgsOrder(t *testing.T) {
	t.Parallel()
	id := identity{subject: "benchX", namespace: "bench-X", stream: "BENCH_X"}
	o := ChildOptions{Inherit: []string{"--config", "c.yaml", "--set", "redis.db=3"}, RedisAddrs: []string{"a:1", "b:2"},
		Set: []string{"scanner.claim_batch=8"}, CPUProfile: "p.prof"}
	got := strings.Join(childArgs(o, "nats://n:4222", id, true), " ")
	want := "run --config c.yaml --set redis.db=3 --nats-url nats://n:4222 --log-level warn --set http.addr=127.0.0.1:0 --set ui.enabled=false " +
		"--set subject=benchX --set namespace=bench-X --set intake.stream.enabled=true --set intake.stream.name=BENCH_X " +
		"--redis-addrs a:1,b:2 --set scanner.claim_batch=8 --cpuprofile p.prof"
	if got != want {
		t.Fatalf("child args\n got %s\nwant %s", got, want)
	}
	o.Embedded = true
	if args := childArgs(o, "nats://n:4222", id, false); !slices.Contains(args, "--embedded") || slices.Contains(args, "--redis-addrs") ||
		!slices.Contains(args, "intake.stream.enabled=false") {
		t.Fatalf("embedded child args: %q", args)
	}
}

// An interrupted one-requester run (Ctrl-C during --compare) still
// cancels every schedule it may have stored: they are due in an hour, and
// none may fire then nor stay stored. Before, the cancels ran on the
// interrupted context and failed at once (SIGINT left 816 stored).
func TestOneRequesterInterruptedLeavesNothingStored(t *testing.T) {
	t.Parallel()
	n, r := testutil.StartNATS(t), testutil.StartRedis(t)
	c := daemontest.Config(n, r)
	daemontest.Start(t, c)
	nc := connect(t, n.URL())
	ctx, interrupt := context.WithCancel(context.Background())
	defer interrupt()
	// The interrupt comes after the fifth schedule request reached NATS.
	var seen atomic.Int64
	sub, err := nc.Subscribe(c.Subject+".schedule", func(*nats.Msg) {
		if seen.Add(1) == 5 {
			interrupt()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	p := newConn(nc, c.Subject)
	w := Workload{Count: 1, Concurrency: 1, Window: time.Second, Target: "bench.target", Timeout: 5 * time.Second}
	_, _ = delaydOneRequester(ctx, p, w, 200)
	if seen.Load() >= 200 {
		t.Fatal("the interrupt came too late to test anything")
	}
	st, err := p.delayd.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if left := st.Pending + st.Inflight; left != 0 {
		t.Fatalf("%d one-requester schedules left stored after the interrupt", left)
	}
}

// A child that exits before it answers (its NATS port taken) ends the
// bench before anything is sent, and nothing reaches the delayd that
// answers on the usual subject there. Before, the bench ran its whole
// workload against whatever answered.
func TestChildExitingFirstEndsTheBench(t *testing.T) {
	t.Setenv(childEnv, "exit")
	n, r := testutil.StartNATS(t), testutil.StartRedis(t)
	c := daemontest.Config(n, r)
	daemontest.Start(t, c)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var dropped []string
	o := Options{NATSURL: n.URL(), Dial: func(url string) (*nats.Conn, error) { return nats.Connect(url) }, Conns: 1,
		Subject: c.Subject, StreamName: c.Intake.Stream.Name, MaxPending: 16, Progress: &bytes.Buffer{},
		Child: &ChildOptions{Binary: self, RedisAddrs: c.Redis.Addrs, Stderr: os.Stderr,
			DropNamespace: func(_ context.Context, ns string) error { dropped = append(dropped, ns); return nil }}}
	w := Workload{Count: 10, Concurrency: 1, Window: time.Second, Target: "bench.target", Timeout: time.Second}
	_, _, err = Run(context.Background(), w, o)
	if err == nil || !strings.Contains(err.Error(), "exited before it answered") {
		t.Fatalf("bench with a child that exits at once: %v", err)
	}
	st, err := newConn(connect(t, n.URL()), c.Subject).delayd.Stats(context.Background())
	if err != nil || st.Pending+st.Inflight != 0 {
		t.Fatalf("the other delayd holds %+v (%v)", st, err)
	}
	if len(dropped) != 1 || !strings.HasPrefix(dropped[0], "bench-") {
		t.Fatalf("namespaces dropped: %q, want the child's", dropped)
	}
}

// A --local --stream bench runs a real delayd child of its own, measures
// it, and leaves nothing behind on the servers: not its intake stream,
// not a key of its Redis namespace. Before, its 16 lease hashes and
// member list stayed in the user's Redis after every run, and its stream
// stayed in the user's NATS.
func TestLocalChildLeavesNothingBehind(t *testing.T) {
	t.Setenv(childEnv, "daemon")
	n, r := testutil.StartNATS(t), testutil.StartRedis(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	rdb := r.Client()
	drop := func(ctx context.Context, ns string) error {
		_, err := store.DropNamespace(ctx, rdb, ns)
		return err
	}
	var progress bytes.Buffer
	// The test's NATS server runs in this process: its pid stands for
	// nats-server's in the CPU split.
	o := Options{NATSURL: n.URL(), Dial: func(url string) (*nats.Conn, error) { return nats.Connect(url) }, Conns: 2,
		Subject: "delayd", Stream: true, Baseline: true, MaxPending: 64, Progress: &progress, NATSPid: os.Getpid(),
		Child: &ChildOptions{Binary: self, RedisAddrs: []string{r.Addr}, Stderr: os.Stderr, DropNamespace: drop,
			RedisCPU: func(ctx context.Context) (float64, error) { return store.RedisCPU(ctx, rdb) }}}
	w := Workload{Count: 100, Concurrency: 4, Lead: 500 * time.Millisecond, Window: 200 * time.Millisecond,
		Target: "bench.target", Timeout: 5 * time.Second, Grace: 10 * time.Second}
	res, _, err := Run(context.Background(), w, o)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, progress.String())
	}
	if res.Delivered != 100 || res.Lost != 0 || res.Rejected != 0 || res.Daemon == nil || res.Daemon.CPUSeconds <= 0 {
		t.Fatalf("bench result: %+v, daemon %+v", res, res.Daemon)
	}
	// Every process is in the split, of the intake, the deliveries and
	// the baseline (a stream nobody consumes: no delayd work, but read).
	if res.CPU == nil {
		t.Fatal("no CPU split")
	}
	for what, split := range map[string]map[string]float64{"intake": res.CPU.Intake, "delivery": res.CPU.Delivery, "baseline": res.BaselineCPU} {
		for _, p := range []string{ProcRedis, ProcDelayd, ProcNATS, ProcBench} {
			if v, ok := split[p]; !ok || v < 0 {
				t.Errorf("%s split: %s missing (%v)", what, p, split)
			}
		}
	}
	if res.Redis == nil {
		t.Error("no Redis usage beside the split")
	}
	if keys, err := rdb.Keys(context.Background(), "*").Result(); err != nil || len(keys) > 0 {
		t.Fatalf("the bench left %d keys of its child in Redis: %v %v", len(keys), keys, err)
	}
	js, err := jetstream.New(connect(t, n.URL()))
	if err != nil {
		t.Fatal(err)
	}
	for names := js.StreamNames(context.Background()); ; {
		name, ok := <-names.Name()
		if !ok {
			break
		}
		if strings.HasPrefix(name, "BENCH_") {
			t.Errorf("the child's stream %s stayed", name)
		}
	}
}

// --batch and --client-batching with --compare: batch requests and the
// batching client each deliver every envelope once, none early, counted
// in envelopes against the echo's requests, beside JetStream schedules in
// the same run. Correctness only.
func TestBatchModesBesideSchedules(t *testing.T) {
	t.Parallel()
	n, r := testutil.StartNATS(t), testutil.StartRedis(t)
	c := daemontest.Config(n, r)
	daemontest.Start(t, c)
	w := Workload{Count: 450, Concurrency: 8, PayloadSize: 128, Lead: time.Second, Window: 500 * time.Millisecond,
		Target: "bench.target", Timeout: 10 * time.Second, Grace: 5 * time.Second}
	o := Options{NATSURL: n.URL(), Dial: func(url string) (*nats.Conn, error) { return nats.Connect(url) }, Conns: 2,
		Subject: c.Subject, StreamName: c.Intake.Stream.Name, MaxPending: 64, Progress: &bytes.Buffer{},
		Baseline: true, Compare: true, Batch: 100, ClientBatching: true}
	first, others, err := Run(context.Background(), w, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(others) != 2 {
		t.Fatalf("%d results beside the first, want the batching client's and JetStream's", len(others))
	}
	all := append([]Result{first}, others...)
	for i, want := range []struct {
		mode  string
		batch int
	}{{ModeBatch, 100}, {ModeClientBatching, 100}, {ModeSchedules, 0}} {
		got := all[i]
		if got.Mode != want.mode || got.Batch != want.batch || got.Delivered != w.Count || got.Lost != 0 || got.Rejected != 0 || got.Early != 0 {
			t.Errorf("result %d: %s batch %d, delivered %d lost %d rejected %d (%s) early %d; want %s batch %d, all delivered",
				i, got.Mode, got.Batch, got.Delivered, got.Lost, got.Rejected, got.FirstRejection, got.Early, want.mode, want.batch)
		}
		if want.mode != ModeSchedules && (got.BaselineRate <= 0 || got.IntakeRatio <= 0) {
			t.Errorf("%s: no ratio to the echo: %+v", got.Mode, got)
		}
	}
	var out bytes.Buffer
	PrintCompare(&out, all)
	if !strings.Contains(out.String(), "batches of 100") || !strings.Contains(out.String(), "client batching ≤100") {
		t.Errorf("compare table:\n%s", out.String())
	}
}
