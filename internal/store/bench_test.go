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
	const chunk = 2000
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
	r := testutil.StartRedis(b)
	s := New(NewClient(Options{Addrs: []string{r.Addr}}), "b", 16)
	b.Cleanup(func() { s.Close() })
	if err := s.Ping(context.Background()); err != nil {
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

// BenchmarkSchedule measures the schedule script, one batch of 64
// envelopes per op, with a backlog already pending.
func BenchmarkSchedule(b *testing.B) {
	for _, n := range pendingSizes(b) {
		b.Run("pending="+sizeName(n), func(b *testing.B) {
			s, _ := benchStore(b)
			fill(b, s, n, "p")
			data := envelope.Encode(envelope.Envelope{Target: "orders.cancel", Payload: make([]byte, 128)})
			items := make([]Item, 64)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := range items {
					items[j] = Item{ID: "s" + strconv.Itoa(i*64+j), DelayMicros: 3600e6, Data: data}
				}
				schedule(b, s, items...)
			}
			b.ReportMetric(float64(b.N*64)/b.Elapsed().Seconds(), "envelopes/s")
		})
	}
}

// BenchmarkClaim measures claim+ack of 64 due envelopes over all 16 shards
// in one pipeline, with a backlog pending that is not due.
func BenchmarkClaim(b *testing.B) {
	for _, n := range pendingSizes(b) {
		b.Run("pending="+sizeName(n), func(b *testing.B) {
			s, _ := benchStore(b)
			fill(b, s, n, "p")
			data := envelope.Encode(envelope.Envelope{Target: "orders.cancel", Payload: make([]byte, 128)})
			ctx := context.Background()
			shards := make([]int, s.Shards())
			for i := range shards {
				shards[i] = i
			}
			items := make([]Item, 64)
			b.ResetTimer()
			claimed := 0
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				for j := range items {
					items[j] = Item{ID: "c" + strconv.Itoa(i*64+j), Absolute: true, AtMicros: 1, Data: data}
				}
				schedule(b, s, items...)
				b.StartTimer()
				res, err := s.Claim(ctx, shards, ClaimOptions{Batch: 256, Lease: time.Minute})
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
				if _, _, err := s.Ack(ctx, acks, time.Second); err != nil {
					b.Fatal(err)
				}
			}
			if claimed != b.N*64 {
				b.Fatalf("claimed %d of %d", claimed, b.N*64)
			}
			b.ReportMetric(float64(claimed)/b.Elapsed().Seconds(), "envelopes/s")
		})
	}
}

// BenchmarkMemoryPerEnvelope reports Redis used_memory per pending envelope
// (16-byte id, 128-byte payload) over 1M pending envelopes.
func BenchmarkMemoryPerEnvelope(b *testing.B) {
	const n = 1_000_000
	for i := 0; i < b.N; i++ {
		s, r := benchStore(b)
		rc := r.Client()
		before := usedMemory(b, rc.Info(context.Background(), "memory").Val())
		fill(b, s, n, "m")
		after := usedMemory(b, rc.Info(context.Background(), "memory").Val())
		b.ReportMetric(float64(after-before)/n, "bytes/envelope")
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
