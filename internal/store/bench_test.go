package store

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/testutil"
)

// fill stores n envelopes with 16-byte ids and 128-byte payloads, due far
// in the future (so they stay pending), through the real schedule script.
func fill(b *testing.B, s *Store, n int, tag string) {
	b.Helper()
	data := envelope.Encode(envelope.Envelope{Target: "orders.cancel", Payload: make([]byte, 128)})
	// 2,000 a script call, all due in one ms (about 125 a shard): with
	// DELAYD_BENCH_FILL_CHUNK the size of an intake's flush instead.
	chunk := 2000
	if v, err := strconv.Atoi(os.Getenv("DELAYD_BENCH_FILL_CHUNK")); err == nil && v > 0 {
		chunk = v
	}
	items := make([]Item, 0, chunk)
	for i := 0; i < n; i++ {
		items = append(items, Item{ID: fmt.Sprintf("%s%015d", tag, i)[:16], DelayMicros: int64(24 * time.Hour / time.Microsecond), Data: data})
		if len(items) == chunk || i == n-1 {
			schedule(b, s, items...)
			items = items[:0]
		}
	}
}

func benchStore(b *testing.B) (*Store, *testutil.Redis) {
	b.Helper()
	var r *testutil.Redis
	opts := Options{}
	if addr := os.Getenv("DELAYD_BENCH_REDIS"); addr != "" {
		// Under valgrind a script call can take longer than the usual
		// read timeout (3 s and the wait timeout).
		opts.WaitTimeout = time.Minute
		// A Redis started by hand, e.g. under valgrind's callgrind to
		// count its instructions: flushed first.
		r = testutil.ExternalRedis(b, addr)
		if err := r.Client().FlushAll(context.Background()).Err(); err != nil {
			b.Fatal(err)
		}
	} else {
		r = testutil.StartRedis(b)
	}
	opts.Addrs = []string{r.Addr}
	s := New(NewClient(opts), "b", 16)
	b.Cleanup(func() { s.Close() })
	if err := s.Ping(context.Background()); err != nil {
		b.Fatal(err)
	}
	// Alone, the bench's daemon writes the newest format it reads, as a
	// fleet of one version does.
	if _, err := s.AgreeFormats(context.Background(), "bench", time.Hour); err != nil {
		b.Fatal(err)
	}
	return s, r
}

// pendingSizes are the backlogs the script benchmarks run at. 10M takes
// minutes and ~3 GB of Redis memory, so it runs only with
// DELAYD_BENCH_BIG=1.
func pendingSizes(b *testing.B) []int {
	if os.Getenv("DELAYD_BENCH_BIG") == "1" {
		return []int{10_000, 10_000_000}
	}
	return []int{10_000}
}

func sizeName(n int) string {
	if n >= 1_000_000 {
		return strconv.Itoa(n/1_000_000) + "M"
	}
	return strconv.Itoa(n/1000) + "k"
}

// BenchmarkSchedule measures the schedule script with a backlog already
// pending: one batch per op of 12 envelopes (about what the intake's
// flushers gather from 64 requesters) or 64, over all 16 shards. Besides
// the wall time it reports, as BenchmarkClaim does, Redis' time and CPU
// and the redis.calls per envelope.
func BenchmarkSchedule(b *testing.B) {
	for _, n := range pendingSizes(b) {
		for _, per := range []int{12, 64} {
			b.Run("pending="+sizeName(n)+"/per-op="+strconv.Itoa(per), func(b *testing.B) {
				s, r := benchStore(b)
				fill(b, s, n, "p")
				ctx := context.Background()
				rc := r.Client()
				data := envelope.Encode(envelope.Envelope{Target: "orders.cancel", Payload: make([]byte, 128)})
				items := make([]Item, per)
				var work redisWork
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					for j := range items {
						items[j] = Item{ID: "s" + strconv.Itoa(i*per+j), DelayMicros: 3600e6, Data: data}
					}
					b.StopTimer()
					before := readWork(rc.Info(ctx, "commandstats", "cpu").Val())
					b.StartTimer()
					schedule(b, s, items...)
					b.StopTimer()
					work.add(readWork(rc.Info(ctx, "commandstats", "cpu").Val()), before)
					b.StartTimer()
				}
				stored := float64(b.N * per)
				b.ReportMetric(stored/b.Elapsed().Seconds(), "envelopes/s")
				b.ReportMetric(work.scriptUs/stored, "redis-µs/envelope")
				b.ReportMetric(work.cpuUs/stored, "redis-cpu-µs/envelope")
				b.ReportMetric(work.calls/stored, "calls/envelope")
			})
		}
	}
}

// BenchmarkClaim measures claim+ack of due envelopes spread over all 16
// shards in one pipeline, with a backlog pending that is not due: 64 per op
// (about 4 per script call, where fixed per-call costs dominate) and 512
// per op (about 32 per call, as under a load of 100k due/s). With held,
// each op acks the claims of the op before it, after its own claim: the
// leases of one claim are still in flight while the next claim adds its
// own, as in a scanner under load. Besides the wall time it reports the
// Redis time per envelope spent in the claim and ack scripts and the
// redis.calls per envelope inside them, from INFO commandstats read around
// each timed part: Redis runs scripts on one thread, so its time per
// envelope is the scanner's ceiling.
func BenchmarkClaim(b *testing.B) {
	for _, n := range pendingSizes(b) {
		for _, per := range []int{64, 512} {
			b.Run("pending="+sizeName(n)+"/per-op="+strconv.Itoa(per), func(b *testing.B) {
				benchClaim(b, n, per, false)
			})
		}
		b.Run("pending="+sizeName(n)+"/held/per-op=512", func(b *testing.B) {
			benchClaim(b, n, 512, true)
		})
	}
}

func benchClaim(b *testing.B, pending, per int, held bool) {
	s, r := benchStore(b)
	fill(b, s, pending, "p")
	data := envelope.Encode(envelope.Envelope{Target: "orders.cancel", Payload: make([]byte, 128)})
	ctx := context.Background()
	rc := r.Client()
	shards := make([]int, s.Shards())
	for i := range shards {
		shards[i] = i
	}
	items := make([]Item, per)
	var work redisWork
	var prev map[int][]Settle // held: the last op's claims, acked after this op's claim
	b.ResetTimer()
	claimed := 0
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		for j := range items {
			items[j] = Item{ID: "c" + strconv.Itoa(i*per+j), Absolute: true, AtMicros: 1, Data: data}
		}
		schedule(b, s, items...)
		before := readWork(rc.Info(ctx, "commandstats", "cpu").Val())
		b.StartTimer()
		res, err := s.Claim(ctx, shards, ClaimOptions{Batch: 1024, Lease: time.Minute, Bytes: 8 << 20})
		if err != nil {
			b.Fatal(err)
		}
		acks := map[int][]Settle{}
		for _, r := range res {
			for _, c := range r.Items {
				acks[r.Shard] = append(acks[r.Shard], Settle{ID: c.ID, Token: c.Token})
				claimed++
			}
		}
		if held {
			acks, prev = prev, acks
		}
		if _, err := s.Ack(ctx, acks, time.Second); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		work.add(readWork(rc.Info(ctx, "commandstats", "cpu").Val()), before)
		b.StartTimer()
	}
	if claimed != b.N*per {
		b.Fatalf("claimed %d of %d", claimed, b.N*per)
	}
	b.ReportMetric(float64(claimed)/b.Elapsed().Seconds(), "envelopes/s")
	b.ReportMetric(work.scriptUs/float64(claimed), "redis-µs/envelope")
	b.ReportMetric(work.cpuUs/float64(claimed), "redis-cpu-µs/envelope")
	b.ReportMetric(work.calls/float64(claimed), "calls/envelope")
}

// redisWork is what INFO counts: the µs spent in EVALSHA and FCALL (wall time, so it
// grows when other processes take the CPU), the commands called (from
// scripts, as nothing else runs meanwhile), and the CPU time of Redis' main
// thread in µs (steadier on a busy machine).
type redisWork struct{ scriptUs, calls, cpuUs float64 }

func (w *redisWork) add(after, before redisWork) {
	w.scriptUs += after.scriptUs - before.scriptUs
	w.calls += after.calls - before.calls
	w.cpuUs += after.cpuUs - before.cpuUs
}

func readWork(info string) redisWork {
	var w redisWork
	for _, line := range strings.Split(info, "\r\n") {
		name, rest, ok := strings.Cut(line, ":")
		if name == "used_cpu_user_main_thread" || name == "used_cpu_sys_main_thread" {
			v, _ := strconv.ParseFloat(rest, 64)
			w.cpuUs += v * 1e6
		}
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		fields := map[string]float64{}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			fields[k], _ = strconv.ParseFloat(v, 64)
		}
		switch name {
		case "cmdstat_evalsha", "cmdstat_fcall":
			w.scriptUs += fields["usec"]
		case "cmdstat_eval", "cmdstat_info", "cmdstat_script|load", "cmdstat_function|load":
		default:
			w.calls += fields["calls"]
		}
	}
	return w
}

// BenchmarkMemoryPerEnvelope reports Redis used_memory per pending envelope
// (16-byte id, 128-byte payload) over 1M pending envelopes.
func BenchmarkMemoryPerEnvelope(b *testing.B) {
	const n = 1_000_000
	for _, layout := range []struct {
		name string
	}{{"due_set"}} {
		b.Run(layout.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				s, r := benchStore(b)
				rc := r.Client()
				before := usedMemory(b, rc.Info(context.Background(), "memory").Val())
				fill(b, s, n, "m")
				after := usedMemory(b, rc.Info(context.Background(), "memory").Val())
				b.ReportMetric(float64(after-before)/n, "bytes/envelope")
			}
		})
	}
}

func usedMemory(b *testing.B, info string) int64 {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	b.Fatal("no used_memory in INFO")
	return 0
}
