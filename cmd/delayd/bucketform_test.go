package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// beforeDueBuckets is the last commit before stored format 4 (the due
// buckets): the daemon that rolling upgrade meets.
const beforeDueBuckets = "d85d6c2"

// TestDueBucketsBesideThePreviousBuild runs the build before the due
// buckets (stored format 4) beside this one, with redis.due_buckets on, on
// one Redis, as a rolling upgrade does. While the older scanner lives,
// this version's intake
// writes pending envelopes to the due set, which the older one reads and
// delivers; once it left, the fleet writes the due buckets, and this
// version delivers both what the due set still held and what went to the
// buckets: each once, never early.
func TestDueBucketsBesideThePreviousBuild(t *testing.T) {
	t.Parallel()
	old := releaseBinary(t, beforeDueBuckets)
	bin := delaydBinary(t)
	r := testutil.StartRedis(t)
	n := testutil.StartNATS(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	ctx := context.Background()
	common := []string{"DELAYD_SHARDS=16", "DELAYD_OWNERSHIP_TTL=3s"}

	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	got := recordArrivals(t, nc, "bk.>")
	schedule := func(prefix string, k int, in time.Duration) []string {
		t.Helper()
		at := time.Now().Add(in).UTC().Format(time.RFC3339Nano)
		ids := make([]string, k)
		for i := range ids {
			ids[i] = prefix + strconv.Itoa(i)
			m, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "bk."+prefix, "Delayd-At", at, "Delayd-Id", ids[i]), ids[i])
			if err != nil || m.Header.Get("Nats-Service-Error") != "" {
				t.Fatalf("schedule %s: %v %v", ids[i], err, m.Header)
			}
		}
		return ids
	}
	delivered := func(ids []string) { t.Helper(); got.once(t, ids, "") }
	// buckets counts the due buckets' keys.
	buckets := func() int {
		keys, err := rdb.Keys(ctx, "{delayd:*}:pending:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return len(keys)
	}
	// waitLog waits for the k-th line of d's log that says what.
	waitLog := func(d *testutil.Daemon, what string, k int) {
		t.Helper()
		testutil.Wait(t, 15*time.Second, fmt.Sprintf("%s logs %q %d times", d.Log, what, k), func() bool {
			b, _ := os.ReadFile(d.Log)
			return strings.Count(string(b), what) >= k
		})
	}

	// This version's daemons run with the due buckets on (the older build
	// would refuse the unknown variable).
	on := "DELAYD_REDIS_DUE_BUCKETS=true"
	intake := testutil.StartDaemon(t, bin, n, r, append(common, "DELAYD_MODE=intake", on)...)
	older := testutil.StartDaemon(t, old, n, r, append(common, "DELAYD_MODE=scanner")...)
	waitLog(intake, "writes=3", 1)
	first := schedule("before", 30, 400*time.Millisecond)
	across := schedule("across", 30, 3*time.Second)
	if k := buckets(); k != 0 {
		t.Fatalf("%d due buckets beside the older build", k)
	}
	delivered(first)
	older.Kill()
	// Alone at first, it wrote format 4 once already.
	waitLog(intake, "writes=4", 2)
	after := schedule("after", 30, 400*time.Millisecond)
	if k := buckets(); k == 0 {
		t.Fatal("no due buckets once the older build left")
	}
	testutil.StartDaemon(t, bin, n, r, append(common, "DELAYD_MODE=scanner", on)...)
	delivered(across)
	delivered(after)
}
