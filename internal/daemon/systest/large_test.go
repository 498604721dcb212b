package systest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/daemon/daemontest"
)

// BenchmarkSmallBesideLarge is issue 29's item 8: 2,000 envelopes of 128
// bytes fall due at the same instant as 100 of 900 kB, on one daemon with
// the default config (16 shards, the derived claim budget). It reports
// the small ones' lateness, and the large payloads' throughput from the
// first large delivery to the last; large=0 is the small ones alone, the
// figure to hold them against. Each round schedules through the
// protocol (Delayd-At), 4 s ahead, and waits for every delivery.
//
//	go test -run '^$' -bench SmallBesideLarge -benchtime 3x ./internal/daemon/systest
func BenchmarkSmallBesideLarge(b *testing.B) {
	for _, large := range []int{0, 100} {
		b.Run("large="+strconv.Itoa(large), func(b *testing.B) {
			e := daemontest.NewEnv(b)
			c := e.Config()
			c.Shards = 16
			e.StartDaemon(c)
			nc := e.Conn()
			defer nc.Close()
			var small []time.Duration
			var mbps []float64
			for i := 0; i < b.N; i++ {
				s, m := smallBesideLarge(b, nc, c.Subject, fmt.Sprintf("r%d", i), 2000, large, 900<<10)
				small = append(small, s...)
				if large > 0 {
					mbps = append(mbps, m)
				}
			}
			slices.Sort(small)
			b.ReportMetric(ms(small[0]), "small-min-ms")
			b.ReportMetric(ms(small[len(small)/2]), "small-p50-ms")
			b.ReportMetric(ms(small[len(small)*99/100]), "small-p99-ms")
			b.ReportMetric(ms(small[len(small)-1]), "small-max-ms")
			if len(mbps) > 0 {
				slices.Sort(mbps)
				b.ReportMetric(mbps[len(mbps)/2], "large-MB/s")
			}
		})
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// smallBesideLarge runs one round: nSmall envelopes of 128 bytes and
// nLarge of size bytes, all due at one instant. It returns the small ones'
// lateness and the large payloads' MB/s (0 without them).
func smallBesideLarge(b *testing.B, nc *nats.Conn, subject, prefix string, nSmall, nLarge, size int) ([]time.Duration, float64) {
	b.Helper()
	var mu sync.Mutex
	var small []time.Duration
	var largeGot int
	var firstLarge, lastLarge time.Time
	all := make(chan struct{})
	due := time.Now().Add(4 * time.Second).Truncate(time.Millisecond)
	sub, err := nc.Subscribe("bench.mixed."+prefix+".>", func(m *nats.Msg) {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()

		if len(m.Data) == size {
			if largeGot == 0 {
				firstLarge = now
			}
			largeGot++
			lastLarge = now
		} else {
			small = append(small, now.Sub(due))
		}
		if len(small) == nSmall && largeGot == nLarge {
			close(all)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		b.Fatal(err)
	}
	cl := client.New(nc, client.Prefix(subject))
	send := func(target string, id string, payload []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := cl.Schedule(ctx, target, payload, client.At(due), client.ID(id)); err != nil {
			b.Errorf("schedule %s: %v", id, err)
		}
	}
	var wg sync.WaitGroup
	// The large ones first, interleaved over 4 senders, then the small
	// ones over 16: all are stored well before they fall due.
	bigPayload, smallPayload := make([]byte, size), make([]byte, 128)
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < nLarge; i += 4 {
				send("bench.mixed."+prefix+".large", prefix+"-L"+strconv.Itoa(i), bigPayload)
			}
		})
	}
	wg.Wait()
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < nSmall; i += 16 {
				send("bench.mixed."+prefix+".small", prefix+"-s"+strconv.Itoa(i), smallPayload)
			}
		})
	}
	wg.Wait()
	if time.Now().After(due) {
		b.Fatalf("scheduling outlasted the lead: the round measures nothing")
	}
	select {
	case <-all:
	case <-time.After(4*time.Second + 60*time.Second):
		mu.Lock()
		defer mu.Unlock()
		b.Fatalf("%d of %d small and %d of %d large delivered in 60 s", len(small), nSmall, largeGot, nLarge)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, l := range small {
		if l < 0 {
			b.Fatalf("a small envelope came %s early", -l)
		}
	}
	mbps := 0.0
	if span := lastLarge.Sub(firstLarge); nLarge > 1 && span > 0 {
		mbps = float64((nLarge-1)*size) / span.Seconds() / 1e6
	}
	return small, mbps
}
