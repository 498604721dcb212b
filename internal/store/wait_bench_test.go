package store

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/testutil"
)

// BenchmarkWait measures intake and delivery with wait_replicas 1 against
// wait_replicas 0, on one master with one local replica attached in both
// cases (so only the WAIT differs), in the same run:
//   - schedule: batches of 64 envelopes from 4 goroutines at once, as the
//     intake's 4 flushers send them;
//   - claim: claim + ack of 512 due envelopes over 16 shards per op, one
//     claim at a time, as the scanner's loop sends them.
//
// Compare the envelopes/s of replicas=1 with replicas=0.
func BenchmarkWait(b *testing.B) {
	m := testutil.StartRedis(b)
	testutil.StartReplica(b, m)
	stores := map[int]*Store{}
	for _, n := range []int{0, 1} {
		var opts []Option
		if n > 0 {
			opts = append(opts, WithWait(WaitOptions{Replicas: n, Timeout: time.Second}))
		}
		s := New(NewClient(Options{Addrs: []string{m.Addr}, WaitTimeout: time.Second}), "bw", 16, opts...)
		b.Cleanup(func() { s.Close() })
		if err := s.Ping(context.Background()); err != nil {
			b.Fatal(err)
		}
		stores[n] = s
	}
	data := envelope.Encode(envelope.Envelope{Target: "orders.cancel", Payload: make([]byte, 128)})
	var seq atomic.Int64
	for _, n := range []int{0, 1} {
		b.Run("schedule/replicas="+strconv.Itoa(n), func(b *testing.B) {
			s := stores[n]
			// RunParallel runs SetParallelism × GOMAXPROCS goroutines: 4.
			b.SetParallelism(max(1, 4/runtime.GOMAXPROCS(0)))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				items := make([]Item, 64)
				for pb.Next() {
					base := seq.Add(64)
					for j := range items {
						items[j] = Item{ID: "s" + strconv.FormatInt(base+int64(j), 10), DelayMicros: 3600e6, Data: data}
					}
					if _, errs := s.Schedule(context.Background(), items); errs[0] != nil {
						b.Error(errs[0])
						return
					}
				}
			})
			b.ReportMetric(float64(b.N*64)/b.Elapsed().Seconds(), "envelopes/s")
		})
	}
	for _, n := range []int{0, 1} {
		b.Run("claim/replicas="+strconv.Itoa(n), func(b *testing.B) {
			s := stores[n]
			ctx := context.Background()
			shards := make([]int, s.Shards())
			for i := range shards {
				shards[i] = i
			}
			const per = 512
			items := make([]Item, per)
			claimed := 0
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				base := seq.Add(per)
				for j := range items {
					items[j] = Item{ID: "c" + strconv.FormatInt(base+int64(j), 10), Absolute: true, AtMicros: 1, Data: data}
				}
				schedule(b, s, items...)
				b.StartTimer()
				res, err := s.Claim(ctx, shards, ClaimOptions{Batch: 1024, Lease: time.Minute})
				if err != nil {
					b.Fatal(err)
				}
				acks := map[int][]Settle{}
				for _, r := range res {
					if r.Unconfirmed {
						b.Fatalf("claim unconfirmed: %v", r.Why)
					}
					for _, c := range r.Items {
						acks[r.Shard] = append(acks[r.Shard], Settle{ID: c.ID, Token: c.Token})
						claimed++
					}
				}
				if _, err := s.Ack(ctx, acks, time.Second); err != nil {
					b.Fatal(err)
				}
			}
			if claimed != b.N*per {
				b.Fatalf("claimed %d of %d", claimed, b.N*per)
			}
			b.ReportMetric(float64(claimed)/b.Elapsed().Seconds(), "envelopes/s")
		})
	}
}
