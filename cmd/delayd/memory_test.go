package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// TestLargePayloadsUnderMemoryLimit: 200 envelopes of 900 kB fall due at
// once at a daemon process with the chart's 96 MiB memory limit. Claims
// are bounded by bytes (scanner.claim_bytes, derived from the limit), so
// the daemon's peak RSS stays under the limit and every envelope is
// delivered. (Before, one claim pulled all 200, about 180 MB, and the
// sidecar was OOM-killed in a loop.)
func TestLargePayloadsUnderMemoryLimit(t *testing.T) {
	daemontest.Soak(t, "measures peak RSS over 180 MB of payloads")
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	bin := delaydBinary(t)
	st := e.InspectStore(c)
	const n, size = 200, 900 << 10
	payload := envelope.Encode(envelope.Envelope{Target: "big.t", Payload: make([]byte, size)})
	due := time.Now().Add(3 * time.Second).UnixMicro()
	for i := 0; i < n; i += 10 {
		items := make([]store.Item, 10)
		for j := range items {
			items[j] = store.Item{ID: "big-" + strconv.Itoa(i+j), Absolute: true, AtMicros: due, Data: payload}
		}
		if _, errs := st.Schedule(context.Background(), items); errs[0] != nil {
			t.Fatal(errs[0])
		}
	}
	nc := e.Conn()
	defer nc.Close()
	var got, first, last atomic.Int64 // deliveries, and the first's and last's time (ns)
	if _, err := nc.Subscribe("big.t", func(m *nats.Msg) {
		if len(m.Data) == size {
			now := time.Now().UnixNano()
			first.CompareAndSwap(0, now)
			last.Store(now)
			got.Add(1)
		}
	}); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	p := startProcEnv(e, bin, c, "GOMEMLIMIT=96MiB")
	testutil.Eventually(60*time.Second, func() bool { return got.Load() >= n })
	peak := peakRSS(t, p.cmd.Process.Pid)
	// The throughput of large payloads, from the first delivery to the
	// last (the daemon starts after they fell due), for BENCHMARKS.
	mbps := 0.0
	if span := time.Duration(last.Load() - first.Load()); got.Load() > 1 && span > 0 {
		mbps = float64((got.Load()-1)*size) / span.Seconds() / 1e6
	}
	t.Logf("%d of %d delivered; peak RSS %d MiB; %.1f MB/s of payload from the first delivery to the last", got.Load(), n, peak>>20, mbps)
	if got.Load() < n {
		t.Fatalf("%d of %d delivered", got.Load(), n)
	}
	if peak > 96<<20 {
		t.Fatalf("peak RSS %d MiB over the 96 MiB limit", peak>>20)
	}
}

// peakRSS reads a process' peak resident set (VmHWM) in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// TestLargeRequestsUnderMemoryLimit: 200 schedule requests of 900 kB sent
// at once to a daemon process under a 96 MiB limit. The intake holds at
// most intake.pending_bytes of them (the NATS client as much again, and
// drops the rest, whose publishers retry), so the peak RSS stays under the
// limit and every one is stored.
func TestLargeRequestsUnderMemoryLimit(t *testing.T) {
	daemontest.Soak(t, "measures peak RSS over 180 MB of requests")
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	bin := delaydBinary(t)
	p := startProcEnv(e, bin, c, "GOMEMLIMIT=96MiB")
	nc := e.Conn()
	defer nc.Close()
	cl := client.New(nc, client.RetryTimeout(5*time.Second))
	payload := make([]byte, 900<<10)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			if _, err := cl.ScheduleRetrying(ctx, "big.req", payload, client.Delay(time.Hour), client.ID("req-"+strconv.Itoa(i))); err != nil {
				failed.Add(1)
				t.Logf("request %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	peak := peakRSS(t, p.cmd.Process.Pid)
	stored := e.Stored(c)
	t.Logf("%d stored, %d failed; peak RSS %d MiB", stored, failed.Load(), peak>>20)
	if failed.Load() > 0 || stored != 200 {
		t.Fatalf("%d of 200 stored, %d requests failed", stored, failed.Load())
	}
	if peak > 96<<20 {
		t.Fatalf("peak RSS %d MiB over the 96 MiB limit", peak>>20)
	}
}
