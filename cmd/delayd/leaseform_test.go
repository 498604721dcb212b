package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// TestLeaseScoresBesideThePreviousBuild runs the build before integer
// lease scores (stored format 3) beside this one on one Redis, as a
// rolling upgrade does. While the older scanner lives, this version's
// scanner writes fractional lease scores too (format 2); leases both
// left behind when killed between claim and publish are re-leased by this
// version when they expire and delivered once, never early; after the
// older one left, the fleet writes whole lease scores, and those a killed
// daemon left behind are re-leased and delivered the same way. On a
// rollback, the older build joining, the whole scores are rewritten as
// fractions, and the older build delivers what a killed daemon of this
// version left.
//
// Its timing: a scanner cut off from NATS claims what falls due, cannot
// publish it, and gives it back unsent 3/4 of its lease after the claim
// (half the lease for the flush, a quarter for the probe that follows);
// it must be killed before that, so the leases are left behind. Where
// the kill follows the claims at once, a 4 s lease (given back at 3 s)
// is the wait the test pays; the rollback's scanner must live on until
// the older build started and it rewrote its leases, and keeps 10 s
// (given back at 7.5 s). The cut comes after the envelopes are stored
// and just before they fall due, so the claims come well before the
// scanner notices the silent path (3 pings of ownership.ttl/4 = 2.25 s),
// however long storing them took.
func TestLeaseScoresBesideThePreviousBuild(t *testing.T) {
	t.Parallel()
	old := releaseBinary(t, beforeIntegerLeases)
	bin := delaydBinary(t)
	r := testutil.StartRedis(t)
	n := testutil.StartNATS(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	ctx := context.Background()
	const shards = 16
	// A 3 s ownership TTL: a daemon cut off from NATS notices it after
	// 2.25 s or more, well after it claimed what falls due 250 ms after the
	// cut. Leases of 4 s where the kill follows the claims at once, 10 s
	// for the scanner that lives on to rewrite its leases (above).
	common := []string{"DELAYD_SHARDS=" + strconv.Itoa(shards), "DELAYD_OWNERSHIP_TTL=3s", "DELAYD_SCANNER_LEASE=4s"}
	longLease := "DELAYD_SCANNER_LEASE=10s"
	via := func(p *testutil.Proxy) string { return "DELAYD_NATS_URL=nats://" + p.Addr() }
	natsAddr := fmt.Sprintf("127.0.0.1:%d", n.Opts.Port)

	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	got := recordArrivals(t, nc, "up.>")

	testutil.StartDaemon(t, bin, n, r, append(common, "DELAYD_MODE=intake")...)
	// arrived waits until each of ids was delivered.
	arrived := func(ids []string, within time.Duration) { t.Helper(); got.wait(t, ids, within) }
	// schedule stores k ids while the scanners reach NATS, due shortly
	// after, and cuts the scanners behind the proxies off from NATS 250
	// ms before they fall due. A cut that could not come before the due
	// time (storing them, or the sleep, took too long) is lifted, the ids
	// are let through, and others are stored with more time to spare.
	schedule := func(prefix string, k int, proxies ...*testutil.Proxy) []string {
		t.Helper()
		for try, lead := 1, time.Second; ; try, lead = try+1, 2*lead {
			due := time.Now().Add(lead)
			at := due.UTC().Format(time.RFC3339Nano)
			ids := make([]string, k)
			errs := make([]error, k)
			var wg sync.WaitGroup
			for i := range ids {
				ids[i] = fmt.Sprintf("%s%d-%d", prefix, try, i)
				wg.Go(func() {
					m, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "up."+prefix, "Delayd-At", at, "Delayd-Id", ids[i]), ids[i])
					if err == nil && m.Header.Get("Nats-Service-Error") != "" {
						err = fmt.Errorf("%v", m.Header)
					}
					errs[i] = err
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("schedule: %v", err)
			}
			time.Sleep(time.Until(due) - 250*time.Millisecond)
			for _, p := range proxies {
				p.Set(testutil.Up, testutil.Fault{Drop: true})
			}
			if time.Now().Before(due) {
				return ids
			}
			t.Logf("%s: the cut came %s after the due time; again with %s to spare", prefix, time.Since(due), 2*lead)
			for _, p := range proxies {
				p.Set(testutil.Up, testutil.Fault{})
			}
			arrived(ids, 60*time.Second)
		}
	}
	// leases waits until ids are all in flight and returns their scores.
	leases := func(ids []string) map[string]float64 {
		t.Helper()
		want := map[string]bool{}
		for _, id := range ids {
			want[id] = true
		}
		var out map[string]float64
		if !testutil.Eventually(10*time.Second, func() bool {
			out = map[string]float64{}
			for s := range shards {
				zs, err := rdb.ZRangeWithScores(ctx, fmt.Sprintf("{delayd:%d}:inflight", s), 0, -1).Result()
				if err != nil {
					t.Fatal(err)
				}
				for _, z := range zs {
					if id := z.Member.(string); want[id] {
						out[id] = z.Score
					}
				}
			}
			return len(out) == len(ids)
		}) {
			t.Fatalf("%d of %d in flight after 10 s: %v", len(out), len(ids), out)
		}
		return out
	}
	// delivered waits until each of ids arrived once, as attempt 2 (its
	// first lease expired), never early.
	delivered := func(ids []string) { t.Helper(); got.once(t, ids, "2") }
	// formats lists the live announcements "<format>:<id>".
	formats := func() string {
		v, err := rdb.ZRange(ctx, "{delayd:members}:formats", 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(v, " ")
	}
	// waitOwners waits until every shard is owned, by k daemons; it
	// returns the owners it saw last if they never were.
	waitOwners := func(d time.Duration, k int) map[string]bool {
		var owners map[string]bool
		if testutil.Eventually(d, func() bool {
			owners = map[string]bool{}
			for s := range shards {
				owners[rdb.Get(ctx, fmt.Sprintf("{delayd:%d}:owner", s)).Val()] = true
			}
			return len(owners) == k && !owners[""]
		}) {
			return nil
		}
		return owners
	}
	waitLog := func(d *testutil.Daemon, what string) {
		t.Helper()
		testutil.Wait(t, 15*time.Second, fmt.Sprintf("%s logs %q", d.Log, what), func() bool { return d.Logged(what) })
	}

	// The older scanner and this version's, each behind a proxy.
	pOld, pNew := testutil.StartProxy(t, natsAddr), testutil.StartProxy(t, natsAddr)
	older := testutil.StartDaemon(t, old, n, r, append(common, "DELAYD_MODE=scanner", via(pOld))...)
	newer := testutil.StartDaemon(t, bin, n, r, append(common, "DELAYD_MODE=scanner", via(pNew))...)
	waitLog(newer, "writes=2")
	if owners := waitOwners(10*time.Second, 2); owners != nil {
		t.Fatalf("the two scanners do not share the shards: owners %v", owners)
	}
	if f := formats(); !strings.Contains(f, "2:") || !strings.Contains(f, "3:") {
		t.Fatalf("announced formats %q, want a 2 and a 3", f)
	}
	// Both lose NATS, claim, and are killed before they could publish.
	first := schedule("mixed", 40, pOld, pNew)
	for id, score := range leases(first) {
		if score == math.Trunc(score) || score > 1e14 {
			t.Errorf("%s: lease score %v beside the older build, want format 2's fraction", id, score)
		}
	}
	older.Kill()
	newer.Kill()

	// This version alone: it re-leases and delivers what both left, and
	// writes whole lease scores once the older build's announcement ended.
	pAlone := testutil.StartProxy(t, natsAddr)
	alone := testutil.StartDaemon(t, bin, n, r, append(common, "DELAYD_MODE=scanner", via(pAlone))...)
	delivered(first)
	waitLog(alone, "writes=3")
	if f := formats(); strings.Contains(f, "2:") {
		t.Fatalf("announced formats %q after the older build left", f)
	}
	second := schedule("whole", 40, pAlone)
	for id, score := range leases(second) {
		if score != math.Trunc(score) || score < 1e14 || int64(score)%1000 == 0 {
			t.Errorf("%s: lease score %v once the fleet agreed on format 3, want a whole token", id, score)
		}
	}
	alone.Kill()
	after := testutil.StartDaemon(t, bin, n, r, append(common, "DELAYD_MODE=scanner")...)
	delivered(second)

	// A rollback: this version's scanner (alone, behind a proxy) holds
	// whole leases when the older build joins. It rewrites them as
	// fractions, and is killed; the older build re-leases them when they
	// expire and delivers them once, never early.
	pLast := testutil.StartProxy(t, natsAddr)
	last := testutil.StartDaemon(t, bin, n, r, append(common, "DELAYD_MODE=scanner", via(pLast), longLease)...)
	after.Stop()
	if owners := waitOwners(15*time.Second, 1); owners != nil {
		t.Fatalf("one scanner does not own every shard: owners %v", owners)
	}
	third := schedule("back", 40, pLast)
	for id, score := range leases(third) {
		if score != math.Trunc(score) || score < 1e14 {
			t.Fatalf("%s: lease score %v before the rollback, want a whole token", id, score)
		}
	}
	testutil.StartDaemon(t, old, n, r, append(common, "DELAYD_MODE=scanner")...)
	whole := 0
	if !testutil.Eventually(10*time.Second, func() bool {
		whole = 0
		for _, score := range leases(third) {
			if score > 1e14 {
				whole++
			}
		}
		return whole == 0
	}) {
		t.Fatalf("%d whole lease scores left 10 s after the older build joined", whole)
	}
	last.Kill()
	delivered(third)
}
