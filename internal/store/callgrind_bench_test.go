package store

import (
	"context"
	"os"
	osexec "os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/envelope"
)

// BenchmarkCallgrindPhases drives a redis-server run under valgrind's
// callgrind (DELAYD_BENCH_REDIS its address, DELAYD_CALLGRIND_PID its
// pid) and dumps its instruction counts after each phase with
// callgrind_control: first 19,200 due envelopes at distinct ms claimed
// DELAYD_CALLGRIND_BATCH (default 4) a shard a claim and acked, then 1,500
// schedule calls of 12 envelopes due in an hour, both over 16 shards with
// 10,000 pending a day ahead. Redis' instructions per envelope are the
// dumps' totals over 19,200 and 18,000 (docs/benchmarks-history.md, the due
// buckets); DELAYD_BENCH_DUE_BUCKETS=1 runs it with the buckets.
func BenchmarkCallgrindPhases(b *testing.B) {
	pid := os.Getenv("DELAYD_CALLGRIND_PID")
	if pid == "" || os.Getenv("DELAYD_BENCH_REDIS") == "" {
		b.Skip("needs DELAYD_BENCH_REDIS and DELAYD_CALLGRIND_PID")
	}
	s, _ := benchStore(b)
	ctx := context.Background()
	data := envelope.Encode(envelope.Envelope{Target: "orders.cancel", Payload: make([]byte, 128)})
	ctl := func(arg string) {
		if out, err := osexec.Command("callgrind_control", arg, pid).CombinedOutput(); err != nil {
			b.Fatal(err, string(out))
		}
	}
	sched := func(n, per int, tag string, item func(id string, k int) Item) {
		for i := range n {
			items := make([]Item, per)
			for j := range items {
				items[j] = item(tag+strconv.Itoa(i*per+j), i*per+j)
			}
			if _, errs := s.Schedule(ctx, items); errs[0] != nil {
				b.Fatal(errs[0])
			}
		}
	}
	// Calls of 500: a script under valgrind stays within the read timeout.
	sched(20, 500, "p", func(id string, _ int) Item {
		return Item{ID: id, DelayMicros: 24 * 3600e6, Data: data}
	})
	sched(300, 64, "c", func(id string, k int) Item {
		return Item{ID: id, Absolute: true, AtMicros: int64(1+k) * 1000, Data: data}
	})
	batch := 4
	if v, err := strconv.Atoi(os.Getenv("DELAYD_CALLGRIND_BATCH")); err == nil && v > 0 {
		batch = v
	}
	shards := make([]int, s.Shards())
	for i := range shards {
		shards[i] = i
	}
	b.ResetTimer()
	ctl("-z")
	for claimed := 0; claimed < 19_200; {
		res, err := s.Claim(ctx, shards, ClaimOptions{Batch: batch, Lease: time.Minute, Bytes: 8 << 20})
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
		if len(acks) == 0 {
			b.Fatalf("nothing claimed after %d", claimed)
		}
		if _, err := s.Ack(ctx, acks, time.Second); err != nil {
			b.Fatal(err)
		}
	}
	ctl("-d")
	ctl("-z")
	sched(1500, 12, "s", func(id string, _ int) Item { return Item{ID: id, DelayMicros: 3600e6, Data: data} })
	ctl("-d")
}
