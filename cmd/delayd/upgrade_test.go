package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// TestPreReleaseDataRefusedThenMigrated runs a build of a retired stored
// format (0.1.0, and the last build before format 3: both write lease
// scores as the expiry plus a fraction) until it holds leases of a claim
// it could not publish (cut off from NATS, then killed) and pending
// envelopes. This version refuses to start on that data, naming delayd
// migrate, and so does doctor; delayd migrate moves it; then this version
// delivers each envelope once, never early: the leased ones as attempt 2,
// only once their lease ended (a lease score of format 2 read as a token
// would have ended in 1973), the pending ones as attempt 1. (It replaces
// the rolling upgrades from those builds: their formats are retired.)
func TestPreReleaseDataRefusedThenMigrated(t *testing.T) {
	t.Parallel()
	for _, build := range []struct{ name, commit string }{{"0.1.0", previousRelease}, {"format2", beforeIntegerLeases}} {
		t.Run(build.name, func(t *testing.T) {
			t.Parallel()
			preReleaseMigrated(t, releaseBinary(t, build.commit))
		})
	}
}

func preReleaseMigrated(t *testing.T, old string) {
	bin := delaydBinary(t)
	r := testutil.StartRedis(t)
	n := testutil.StartNATS(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	ctx := context.Background()
	const shards = 16
	// A lease of 8 s: the scanner cut off from NATS would give its claim
	// back unsent at 6 s; it is killed well before.
	common := []string{fmt.Sprintf("DELAYD_SHARDS=%d", shards), "DELAYD_OWNERSHIP_TTL=3s", "DELAYD_SCANNER_LEASE=8s"}
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	got := recordArrivals(t, nc, "up.>")
	send := func(ids []string, at time.Time) {
		t.Helper()
		errs := make([]error, len(ids))
		var wg sync.WaitGroup
		for i, id := range ids {
			wg.Go(func() {
				m, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "up.x",
					"Delayd-At", at.UTC().Format(time.RFC3339Nano), "Delayd-Id", id), id)
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
	}
	ids := func(prefix string, k int) []string {
		out := make([]string, k)
		for i := range out {
			out[i] = fmt.Sprintf("%s%d", prefix, i)
		}
		return out
	}

	intake := testutil.StartDaemon(t, old, n, r, append(common, "DELAYD_MODE=intake")...)
	proxy := testutil.StartProxy(t, fmt.Sprintf("127.0.0.1:%d", n.Opts.Port))
	older := testutil.StartDaemon(t, old, n, r, append(common, "DELAYD_MODE=scanner", "DELAYD_NATS_URL=nats://"+proxy.Addr())...)
	// Leased: due shortly, the scanner cut off from NATS 250 ms before. A
	// cut that could not come before the due time (storing them, or the
	// sleep, took too long) is lifted, the ids are let through, and others
	// are stored with more time to spare.
	var leased []string
	for try, lead := 1, time.Second; ; try, lead = try+1, 2*lead {
		batch := ids(fmt.Sprintf("leased%d-", try), 20)
		due := time.Now().Add(lead)
		send(batch, due)
		time.Sleep(time.Until(due) - 250*time.Millisecond)
		proxy.Set(testutil.Up, testutil.Fault{Drop: true})
		if time.Now().Before(due) {
			leased = batch
			break
		}
		t.Logf("the cut came %s after the due time; again with %s to spare", time.Since(due), 2*lead)
		proxy.Set(testutil.Up, testutil.Fault{})
		got.wait(t, batch, 60*time.Second)
	}
	// Pending: due after the older build is gone and the data moved.
	later := ids("later", 20)
	send(later, time.Now().Add(6*time.Second))
	var leaseEnd time.Time
	leases, fractional := 0, 0
	if !testutil.Eventually(10*time.Second, func() bool {
		leases, fractional = 0, 0
		for s := range shards {
			for _, z := range rdb.ZRangeWithScores(ctx, fmt.Sprintf("{delayd:%d}:inflight", s), 0, -1).Val() {
				leases++
				if z.Score != math.Trunc(z.Score) && z.Score < 1e14 {
					fractional++
				}
				if end := time.UnixMilli(int64(z.Score)); leaseEnd.IsZero() || end.Before(leaseEnd) {
					leaseEnd = end
				}
			}
		}
		return leases == len(leased)
	}) {
		t.Fatalf("%d of %d leased after 10 s", leases, len(leased))
	}
	if fractional != leases {
		t.Fatalf("%d of %d lease scores fractional: the older build should write format 2", fractional, leases)
	}
	older.Kill()
	intake.Kill()

	// This version refuses to start, naming the command.
	refusesToStart(t, bin, append(common, "DELAYD_NATS_URL="+n.URL(), "DELAYD_REDIS_ADDRS="+r.Addr), "format 2's data",
		"delayd migrate", fmt.Sprintf("%d lease scores of formats 1 and 2", len(leased)))

	getenv := func(k string) string {
		return map[string]string{"DELAYD_REDIS_ADDRS": r.Addr, "DELAYD_SHARDS": fmt.Sprint(shards)}[k]
	}
	var out bytes.Buffer
	err = run(ctx, []string{"delayd", "doctor"}, getenv, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "delayd migrate") || !strings.Contains(out.String(), "retired formats:") {
		t.Fatalf("doctor on format 2's data: %v\n%s", err, out.String())
	}
	// The killed scanner counts as live until its heartbeat ends.
	if !testutil.Eventually(15*time.Second, func() bool {
		out.Reset()
		err = run(ctx, []string{"delayd", "migrate"}, getenv, &out, &out)
		if err != nil && !strings.Contains(err.Error(), "stop it") {
			t.Fatalf("migrate: %v\n%s", err, out.String())
		}
		return err == nil
	}) {
		t.Fatalf("migrate: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := run(ctx, []string{"delayd", "doctor"}, getenv, &out, &out); err != nil {
		t.Fatalf("doctor after migrate: %v\n%s", err, out.String())
	}

	testutil.StartDaemon(t, bin, n, r, common...)
	got.once(t, later, "1")
	if time.Now().Before(leaseEnd) {
		got.none(t, leased)
	} else {
		t.Logf("the leases ended %s before the check that none of them was delivered", time.Since(leaseEnd))
	}
	got.once(t, leased, "2")
}

// refusesToStart runs bin with env and fails the test unless it exits
// within 15 s saying each of want (what names the data, for the message).
func refusesToStart(t *testing.T, bin string, env []string, what string, want ...string) {
	t.Helper()
	start := exec.Command(bin, "run")
	start.Env = append(testutil.ChildEnv(), append(env, "DELAYD_HTTP_ADDR=127.0.0.1:0", "DELAYD_UI_ADDR=127.0.0.1:0")...)
	var stderr bytes.Buffer
	start.Stderr = &stderr
	done := make(chan error, 1)
	if err := start.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- start.Wait() }()
	select {
	case err := <-done:
		for _, w := range want {
			if err == nil || !strings.Contains(stderr.String(), w) {
				t.Fatalf("start on %s: %v, want a refusal saying %q:\n%s", what, err, w, stderr.String())
			}
		}
	case <-time.After(15 * time.Second):
		_ = start.Process.Kill()
		t.Fatalf("this version started on %s:\n%s", what, stderr.String())
	}
}
