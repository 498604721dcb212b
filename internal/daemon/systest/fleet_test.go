package systest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// commandCalls sums Redis' per-command call counters.
func commandCalls(t *testing.T, r *testutil.Redis) int64 {
	t.Helper()
	info, err := r.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\r\n") {
		_, rest, ok := strings.Cut(line, ":calls=")
		if !ok {
			continue
		}
		v, _, _ := strings.Cut(rest, ",")
		x, _ := strconv.ParseInt(v, 10, 64)
		n += x
	}
	return n
}

// TestIdleLoadFlat: Redis commands per second at idle with ten daemons are
// at most twice those with one, measured from INFO commandstats deltas.
func TestIdleLoadFlat(t *testing.T) {
	daemontest.Soak(t, "measures idle Redis load for 2 x 8 s")
	t.Parallel()
	measure := func(daemons int) float64 {
		e := daemontest.NewEnv(t)
		c := e.Config()
		c.Shards = 16
		c.Ownership.TTL = 3 * time.Second
		c.Scanner.IdleInterval = time.Second
		var stops []func() error
		for range daemons {
			c.HTTP.Addr = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
			stops = append(stops, e.StartDaemon(c))
		}
		waitSettled(t, e.InspectStore(c), c.Ownership.TTL)
		before, t0 := commandCalls(t, e.Redis), time.Now()
		time.Sleep(8 * time.Second)
		rate := float64(commandCalls(t, e.Redis)-before-1) / time.Since(t0).Seconds()
		for _, stop := range stops {
			_ = stop()
		}
		return rate
	}
	one := measure(1)
	ten := measure(10)
	t.Logf("idle Redis commands/s: 1 daemon %.0f, 10 daemons %.0f, ratio %.2f", one, ten, ten/one)
	if ten > 2*one {
		t.Errorf("idle Redis load grows with daemons: %.0f/s with 10 vs %.0f/s with 1", ten, one)
	}
}

// crossDaemonRun schedules n envelopes through an intake-only daemon for
// shards a scanner-only daemon owns, with an idle interval so long that
// only the NATS wake-up can deliver them on time; it returns the lateness
// of each, sorted.
func crossDaemonRun(t testing.TB, n int) []time.Duration {
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Scanner.IdleInterval = 5 * time.Second
	ci := c
	ci.Mode = "intake"
	e.StartDaemon(ci)
	cs := c
	cs.Mode = "scanner"
	cs.HTTP.Addr = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	e.StartDaemon(cs)
	nc := e.Conn()
	defer nc.Close()
	s := e.Sink(nc, "cross.target")
	// The scanner takes every shard.
	st := e.InspectStore(c)
	waitOwned(t, st)
	ids := daemontest.ScheduleMany(t, nc, n, 16, "x", func(i int, h nats.Header) {
		h.Set("Delayd-Target", "cross.target")
		h.Set("Delayd-Delay", strconv.Itoa(50+i%900)+"ms")
	})
	s.WaitCount(len(ids), 15*time.Second)
	lateness, dups := s.Check(t, ids)
	if dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
	slices.Sort(lateness)
	return lateness
}

// TestCrossDaemonWake: envelopes accepted by one daemon for shards another
// owns are delivered far sooner than the owner's 5 s idle interval, so the
// wake-up works. How soon is for a benchmark to say (no timed tests):
// BenchmarkCrossDaemonWake reports the p99.
func TestCrossDaemonWake(t *testing.T) {
	l := crossDaemonRun(t, 2000)
	if len(l) == 0 {
		t.Fatal("nothing delivered")
	}
	p99 := l[len(l)*99/100]
	t.Logf("cross-daemon lateness p50 %s p99 %s max %s", l[len(l)/2], p99, l[len(l)-1])
	if p99 > time.Second {
		t.Errorf("p99 lateness %s: wake-ups are not reaching the owner (idle interval 5 s)", p99)
	}
}

// BenchmarkCrossDaemonWake reports the lateness of envelopes that need a
// cross-daemon wake-up (2,000 per run, delays 50–950 ms).
func BenchmarkCrossDaemonWake(b *testing.B) {
	for i := 0; i < b.N; i++ {
		l := crossDaemonRun(b, 2000)
		b.ReportMetric(float64(l[len(l)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(l[len(l)*99/100].Microseconds())/1000, "p99-ms")
		b.ReportMetric(float64(l[len(l)-1].Microseconds())/1000, "max-ms")
	}
}

// waitSettled waits until every shard is owned and no owner changed for
// a whole ownership TTL: the daemons agree on their shares.
func waitSettled(t *testing.T, st *store.Store, ttl time.Duration) {
	t.Helper()
	var last []string
	changed := time.Now()
	var err error
	if !testutil.Eventually(30*time.Second, func() bool {
		var owners []string
		owners, err = st.Owners(context.Background())
		if err != nil || slices.Contains(owners, "") || !slices.Equal(owners, last) {
			last, changed = owners, time.Now()
			return false
		}
		return time.Since(changed) >= ttl
	}) {
		t.Fatalf("ownership did not settle: %v %v", last, err)
	}
}

// TestIntakeDaemonWritesConfigLimits: a daemon that does not deliver
// (mode intake) has a Gate that never runs; it still writes the config
// file's limits, through that Gate's first reading of the rules.
func TestIntakeDaemonWritesConfigLimits(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Mode = "intake"
	c.Targets.Limits = []string{"cfg.> 5/s 2", "other.x 1/h"}
	e.StartDaemon(c)
	st := e.InspectStore(c)
	testutil.Wait(t, 10*time.Second, "both config limits in Redis", func() bool {
		r, err := st.FlowRules(context.Background())
		return err == nil && len(r.Limits) == 2
	})
}
