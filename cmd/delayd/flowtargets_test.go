package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// TestFlowTargets is issue 39's black-box run: two daemon processes on one
// Redis and NATS, driven as a user would (the CLI, the schedule subject).
//   - A limit of 1,000/s and 5,000 envelopes due at one instant: no sliding
//     second holds more than 1,200 deliveries to the limited target, all
//     arrive within 8 s, none early, lost or repeated; 2,000 to an
//     unlimited target beside them keep p99 lateness within 50 ms.
//   - A pause: nothing while paused; the resume delivers all within 3 s,
//     each with the attempt it had.
//   - Jitter 2 s on 1,000 due at one instant: none early, all within due +
//     2.1 s, spread over at least 1.5 s.
//
// The correctness of each (nothing early, lost or repeated, nothing over
// the rate, nothing while paused, the attempts kept) is asserted; the
// times are measured and logged for BENCHMARKS.md, never asserted (speed
// is not a test's pass or fail: CONTRIBUTING.md).
func TestFlowTargets(t *testing.T) {
	daemontest.Soak(t, "flow control's targets with two daemons")
	bin := testutil.BuildBinary(t)
	n, r := testutil.StartNATS(t), testutil.StartRedis(t)
	for range 2 {
		testutil.StartDaemon(t, bin, n, r, "DELAYD_SHARDS=16", "DELAYD_SCANNER_IDLE_INTERVAL=1s")
	}
	e := &daemontest.Env{T: t, Redis: r, NATS: n}
	cli := flowCLI(t, e)
	nc := e.Conn()
	defer nc.Close()
	check := func(ok bool, format string, a ...any) {
		t.Helper()
		verdict := map[bool]string{true: "met", false: "missed"}[ok]
		if raceEnabled {
			verdict += " (under -race)"
		}
		t.Logf("target %s: %s", verdict, fmt.Sprintf(format, a...))
	}

	t.Run("limit", func(t *testing.T) {
		cli("limit", "limited.>", "1000/s")
		limited, free := e.Sink(nc, "limited.>"), e.Sink(nc, "free.>")
		at := time.Now().Add(6 * time.Second).Truncate(time.Millisecond)
		schedule(t, nc, 5000, "l-", "limited.x", at, 0)
		schedule(t, nc, 2000, "f-", "free.x", at, 0)
		limited.WaitCount(5000, 30*time.Second)
		free.WaitCount(2000, 10*time.Second)
		got, early, dups := flowArrivals(limited, 5000, "l-")
		if len(got) != 5000 || early > 0 || dups > 0 {
			t.Fatalf("limited: %d of 5000 arrived, %d early, %d repeated", len(got), early, dups)
		}
		most, _ := maxInWindow(got, time.Second)
		if most > 1200 {
			t.Errorf("%d deliveries in one sliding second at 1,000/s, over 1,200", most)
		}
		t.Logf("limited: most in a sliding second %d (target ≤ 1,200)", most)
		check(got[len(got)-1].Sub(at) <= 8*time.Second, "limited: the last of 5,000 arrived %s after the due time (≤ 8 s)",
			got[len(got)-1].Sub(at).Round(time.Millisecond))
		lat := lateness(free, 2000, "f-")
		if len(lat) != 2000 {
			t.Fatalf("unlimited: %d of 2000 arrived once, in time", len(lat))
		}
		check(lat[len(lat)*99/100] <= 50*time.Millisecond, "unlimited beside it: p99 lateness %s (≤ 50 ms); p50 %s, p90 %s, max %s",
			lat[len(lat)*99/100], lat[len(lat)/2], lat[len(lat)*9/10], lat[len(lat)-1])
	})

	t.Run("pause", func(t *testing.T) {
		cli("pause", "paused.>")
		sink := e.Sink(nc, "paused.>")
		at := time.Now().Add(3 * time.Second).Truncate(time.Millisecond)
		schedule(t, nc, 1000, "p-", "paused.x", at, 0)
		time.Sleep(time.Until(at.Add(2 * time.Second))) // every one due for 2 s
		if c := sink.Count(); c != 0 {
			t.Fatalf("%d deliveries while paused", c)
		}
		start := time.Now()
		cli("resume", "paused.>")
		sink.WaitCount(1000, 30*time.Second)
		got, early, dups := flowArrivals(sink, 1000, "p-")
		if len(got) != 1000 || early > 0 || dups > 0 {
			t.Fatalf("after the resume %d of 1000 arrived, %d early, %d repeated", len(got), early, dups)
		}
		// The last arrival, not the command's return: the command answers
		// once every daemon holds the change (2 s), after the deliveries.
		took := got[len(got)-1].Sub(start)
		for id, ds := range sink.All() {
			if ds[0].Attempt != 1 {
				t.Errorf("%s: attempt %d after the resume, want the 1 it had", id, ds[0].Attempt)
			}
		}
		check(took <= 3*time.Second, "pause: 0 while paused; the last of 1,000 arrived %s after the resume command began (≤ 3 s)",
			took.Round(time.Millisecond))
	})

	t.Run("jitter", func(t *testing.T) {
		sink := e.Sink(nc, "jittered.>")
		at := time.Now().Add(3 * time.Second).Truncate(time.Millisecond)
		schedule(t, nc, 1000, "j-", "jittered.x", at, 2*time.Second)
		sink.WaitCount(1000, 15*time.Second)
		got, early, dups := flowArrivals(sink, 1000, "j-")
		if len(got) != 1000 || early > 0 || dups > 0 {
			t.Fatalf("jitter: %d of 1000 arrived, %d early (before their jittered time), %d repeated", len(got), early, dups)
		}
		if got[0].Before(at) {
			t.Fatalf("jitter: one arrived %s before the due time", at.Sub(got[0]))
		}
		spread := got[len(got)-1].Sub(got[0])
		check(got[len(got)-1].Sub(at) <= 2100*time.Millisecond && spread >= 1500*time.Millisecond,
			"jitter 2 s: the last arrived %s after due (≤ 2.1 s), spread %s (≥ 1.5 s)",
			got[len(got)-1].Sub(at).Round(time.Millisecond), spread.Round(time.Millisecond))
	})
}

// raceEnabled: the test binary is built with -race (race_test.go).
var raceEnabled bool

// schedule sends n envelopes to target, all due at at, ids prefix0...,
// with jitter if > 0.
func schedule(t *testing.T, nc *nats.Conn, n int, prefix, target string, at time.Time, jitter time.Duration) {
	t.Helper()
	cl, err := client.Connect(nc.ConnectedUrl(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	envs := make([]client.Envelope, 0, 500)
	flush := func() {
		res, err := cl.ScheduleBatch(context.Background(), envs)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
		envs = envs[:0]
	}
	for i := range n {
		opts := []client.ScheduleOption{client.ID(prefix + strconv.Itoa(i)), client.At(at)}
		if jitter > 0 {
			opts = append(opts, client.Jitter(jitter))
		}
		envs = append(envs, client.Envelope{Target: target, Payload: []byte("x"), Options: opts})
		if len(envs) == cap(envs) {
			flush()
		}
	}
	if len(envs) > 0 {
		flush()
	}
}

// flowArrivals are the sorted arrival times of ids prefix0..n-1 that arrived,
// and how many arrived before their Delayd-Due or more than once.
func flowArrivals(s *daemontest.Sink, n int, prefix string) (got []time.Time, early, dups int) {
	for i := range n {
		ds := s.Get(prefix + strconv.Itoa(i))
		if len(ds) == 0 {
			continue
		}
		dups += len(ds) - 1
		if ds[0].Received.Before(ds[0].Due) {
			early++
		}
		got = append(got, ds[0].Received)
	}
	slices.SortFunc(got, func(a, b time.Time) int { return a.Compare(b) })
	return got, early, dups
}

// lateness are the sorted lateness of ids prefix0..n-1 that arrived once.
func lateness(s *daemontest.Sink, n int, prefix string) []time.Duration {
	var out []time.Duration
	for i := range n {
		if ds := s.Get(prefix + strconv.Itoa(i)); len(ds) == 1 {
			out = append(out, ds[0].Received.Sub(ds[0].Due))
		}
	}
	slices.Sort(out)
	return out
}

// maxInWindow is the most arrivals (sorted) within any window of d, and
// when that window begins.
func maxInWindow(got []time.Time, d time.Duration) (int, time.Time) {
	most, at := 0, time.Time{}
	for i, j := 0, 0; i < len(got); i++ {
		for got[i].Sub(got[j]) >= d {
			j++
		}
		if i-j+1 > most {
			most, at = i-j+1, got[j]
		}
	}
	return most, at
}
