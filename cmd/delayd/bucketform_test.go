package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

// lastDueBuckets is the last commit whose builds wrote the due buckets
// (stored format 4, with redis.due_buckets on), retired since.
const lastDueBuckets = "6a7095f"

// TestDueBucketsRefusedThenMigrated runs the last build of the due
// buckets with redis.due_buckets on until its pending envelopes are in
// them, and stops it. This version refuses to start on that data, naming
// delayd migrate and the buckets (though the namespace's schema key says
// format 3: that build wrote it), and so does doctor, which repairs
// nothing then (the buckets' ids would look unindexed, and be made due
// at once); delayd migrate moves them to the due set; then this version
// delivers each once, never early.
func TestDueBucketsRefusedThenMigrated(t *testing.T) {
	t.Parallel()
	old := releaseBinary(t, lastDueBuckets)
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

	d := testutil.StartDaemon(t, old, n, r, append(common, "DELAYD_REDIS_DUE_BUCKETS=true")...)
	testutil.Wait(t, 15*time.Second, "the older build writes format 4", func() bool { return d.Logged("writes=4") })
	due := time.Now().Add(20 * time.Second)
	ids := make([]string, 40)
	for i := range ids {
		ids[i] = "b" + strconv.Itoa(i)
		m, err := daemontest.Schedule(nc, "delayd", daemontest.Hdr("Delayd-Target", "bk.x",
			"Delayd-At", due.UTC().Format(time.RFC3339Nano), "Delayd-Id", ids[i]), ids[i])
		if err != nil || m.Header.Get("Nats-Service-Error") != "" {
			t.Fatalf("schedule %s: %v %v", ids[i], err, m)
		}
	}
	if keys := rdb.Keys(ctx, "{delayd:*}:pending:*").Val(); len(keys) == 0 {
		t.Fatal("the older build wrote no due buckets")
	}
	d.Stop()

	refusesToStart(t, bin, append(common, "DELAYD_NATS_URL="+n.URL(), "DELAYD_REDIS_ADDRS="+r.Addr), "the due buckets",
		"delayd migrate", "40 envelopes in the due buckets")

	getenv := func(k string) string {
		return map[string]string{"DELAYD_REDIS_ADDRS": r.Addr, "DELAYD_SHARDS": "16"}[k]
	}
	var out bytes.Buffer
	err = run(ctx, []string{"delayd", "doctor", "--repair"}, getenv, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "delayd migrate") || !strings.Contains(out.String(), "40 envelopes in the due buckets") {
		t.Fatalf("doctor on the due buckets: %v\n%s", err, out.String())
	}
	if n := rdb.ZCard(ctx, "{delayd:0}:due").Val(); n != 0 {
		t.Fatalf("doctor --repair made %d of the buckets' envelopes due", n)
	}
	out.Reset()
	if err := run(ctx, []string{"delayd", "migrate"}, getenv, &out, &out); err != nil || !strings.Contains(out.String(), "40 envelopes in the due buckets") {
		t.Fatalf("migrate: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := run(ctx, []string{"delayd", "doctor"}, getenv, &out, &out); err != nil {
		t.Fatalf("doctor after migrate: %v\n%s", err, out.String())
	}
	testutil.StartDaemon(t, bin, n, r, common...)
	got.once(t, ids, "1")
}
