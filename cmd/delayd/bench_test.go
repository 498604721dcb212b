package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/bench"
	"github.com/delayd/delayd/internal/daemon/daemontest"
)

// TestBenchCommand runs `delayd bench` against a running daemon and checks
// its JSON result adds up.
func TestBenchCommand(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	e.StartDaemon(c)
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"delayd", "bench", "--nats-url", e.NATS.URL(), "--json",
		"--count", "500", "--concurrency", "8", "--window", "500ms", "--lead", "1s", "--grace", "5s", "--conns", "2"},
		func(string) string { return "" }, &out, &errOut)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, errOut.String())
	}
	var r bench.Result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("bench JSON: %v\n%s", err, out.String())
	}
	if r.Delivered != 500 || r.Lost != 0 || r.Early != 0 || r.Duplicates != 0 || r.Rejected != 0 {
		t.Fatalf("bench result: %+v", r)
	}
	if r.BaselineRate <= 0 || r.IntakeRate <= 0 || r.IntakeRatio <= 0 || len(r.Histogram) == 0 {
		t.Fatalf("bench figures missing: %+v", r)
	}
	if r.Redis != nil {
		t.Fatalf("Redis CPU reported without a --local child (whose Redis is the bench's): %+v", r.Redis)
	}
	t.Logf("bench: intake %.0f/s (%.0f%% of %.0f/s), p99 %.2f ms", r.IntakeRate, 100*r.IntakeRatio, r.BaselineRate, r.LatenessMs.P99)
}

// TestBenchStreamCompare runs `delayd bench --stream --compare`: the
// stream intake against a running daemon, and JetStream message schedules
// on the same server (it runs them), side by side, each with its
// one-requester figure beside an echo. Correctness only.
func TestBenchStreamCompare(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	e.StartDaemon(c)
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"delayd", "bench", "--nats-url", e.NATS.URL(), "--json", "--stream", "--compare",
		"--count", "500", "--window", "500ms", "--lead", "1s", "--grace", "5s", "--conns", "2", "--max-pending", "64", "--one-requester", "50"},
		func(string) string { return "" }, &out, &errOut)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, errOut.String())
	}
	var rs []bench.Result
	if err := json.Unmarshal(out.Bytes(), &rs); err != nil || len(rs) != 2 {
		t.Fatalf("bench JSON: %v\n%s", err, out.String())
	}
	d, js := rs[0], rs[1]
	if d.Mode != bench.ModeStream || d.Delivered != 500 || d.Lost != 0 || d.Early != 0 || d.Duplicates != 0 || d.Rejected != 0 {
		t.Fatalf("stream intake result: %+v", d)
	}
	if d.IntakeRate <= 0 || d.PubAckRate <= 0 || d.BaselineRate <= 0 {
		t.Fatalf("stream intake figures missing: %+v", d)
	}
	if js.Mode != bench.ModeSchedules || js.Delivered != 500 || js.Lost != 0 || js.Rejected != 0 {
		t.Fatalf("JetStream schedules result: %+v", js)
	}
	for _, r := range rs {
		if o := r.OneRequester; o == nil || o.Calls != 50 || o.Us <= 0 || o.EchoUs <= 0 {
			t.Fatalf("%s: one-requester figure missing: %+v", r.Mode, o)
		}
	}
	// The run's envelopes were delivered and the one-requester schedules
	// (due in an hour) cancelled: the bench leaves nothing stored.
	daemontest.Quiet(t, e, c)
	if left := e.Stored(c); left != 0 {
		t.Fatalf("%d envelopes left stored after the bench", left)
	}
	t.Logf("stream intake %.0f/s (baseline %.0f/s), p99 %.2f ms; JetStream schedules %.0f/s, p99 %.2f ms, early %d",
		d.IntakeRate, d.BaselineRate, d.LatenessMs.P99, js.IntakeRate, js.LatenessMs.P99, js.Early)
}

// TestBenchEmbeddedNeverLoadsAnotherDelayd: bench --embedded whose child
// cannot bind its NATS port (a server with a real delayd has it) must exit
// non-zero before sending anything, and load nothing into that delayd.
// Before, it ran its whole workload against whatever answered there.
func TestBenchEmbeddedNeverLoadsAnotherDelayd(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.HTTP.Addr = ""
	e.StartDaemon(c)
	bin := delaydBinary(t)
	cmd := exec.Command(bin, "bench", "--embedded", "--nats-url", e.NATS.URL(), "--count", "100", "--baseline=false")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("bench against a port another server holds succeeded:\n%s", out)
	}
	if !strings.Contains(string(out), "exited before it answered") {
		t.Fatalf("bench did not say its child failed:\n%s", out)
	}
	if n := e.Stored(c); n != 0 {
		t.Fatalf("bench loaded %d envelopes into the other delayd", n)
	}
}

// --child-set reaches the child's config, and a --local child's keys are
// deleted from Redis afterwards. In detail: --child-set reaches the child's config: a setting the child refuses
// stops it before it answers, and the bench says so; a setting it takes
// runs the bench through. Without a child the flag is a usage error.
func TestBenchChildSet(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	bin := delaydBinary(t)
	args := []string{"bench", "--local", "--nats-url", e.NATS.URL(), "--redis-addrs", e.Redis.Addr, "--count", "50",
		"--concurrency", "4", "--window", "200ms", "--lead", "500ms", "--baseline=false"}
	out, err := exec.Command(bin, append(args, "--child-set", "scanner.claim_batch=0")...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "scanner.claim_batch") {
		t.Fatalf("a child refusing its --child-set: err %v\n%s", err, out)
	}
	prof := t.TempDir() + "/child.prof"
	out, err = exec.Command(bin, append(args, "--child-set", "scanner.claim_batch=8", "--child-cpuprofile", prof)...).CombinedOutput()
	if err != nil {
		t.Fatalf("bench with --child-set scanner.claim_batch=8: %v\n%s", err, out)
	}
	if fi, err := os.Stat(prof); err != nil || fi.Size() == 0 {
		t.Fatalf("the child wrote no CPU profile: %v", err)
	}
	// The child's namespace was the bench's alone: nothing of it stays
	// (before, its 16 lease hashes did).
	if keys, err := e.Redis.Client().Keys(context.Background(), "{bench-*").Result(); err != nil || len(keys) > 0 {
		t.Fatalf("the bench left %d keys of its child in Redis: %v %v", len(keys), keys, err)
	}
	out, err = exec.Command(bin, "bench", "--nats-url", e.NATS.URL(), "--child-set", "a=b").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "need a child") {
		t.Fatalf("--child-set without a child: err %v\n%s", err, out)
	}
	// --child-binary runs another build as the child (to compare builds
	// with one bench); only with --local.
	if out, err = exec.Command(bin, append(args, "--child-binary", "/nonexistent/delayd")...).CombinedOutput(); err == nil || !strings.Contains(string(out), "/nonexistent/delayd") {
		t.Fatalf("--child-binary of a missing file: err %v\n%s", err, out)
	}
	// A --local child on a Redis of its own: Redis' CPU per schedule and
	// per delivery are reported.
	if out, err = exec.Command(bin, append(args, "--child-binary", bin, "--json")...).Output(); err != nil {
		t.Fatalf("--child-binary of this build: %v\n%s", err, out)
	}
	var r bench.Result
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("bench JSON: %v\n%s", err, out)
	}
	if r.Redis == nil || r.Redis.CPUMicrosPerSchedule <= 0 || r.Redis.CPUMicrosPerDelivery <= 0 {
		t.Fatalf("no Redis CPU per schedule and delivery with --local: %+v\n%s", r.Redis, out)
	}
	out, err = exec.Command(bin, "bench", "--nats-url", e.NATS.URL(), "--child-binary", bin).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--child-binary needs --local") {
		t.Fatalf("--child-binary without --local: err %v\n%s", err, out)
	}
	// The child reads the bench's --set (and --config): here its Redis
	// database, where the bench then deletes what the child wrote.
	if out, err = exec.Command(bin, append(args, "--set", "redis.db=3")...).CombinedOutput(); err != nil {
		t.Fatalf("bench with --set redis.db=3: %v\n%s", err, out)
	}
	for _, db := range []int{0, 3} {
		rc := redis.NewClient(&redis.Options{Addr: e.Redis.Addr, DB: db})
		keys, err := rc.Keys(context.Background(), "{bench-*").Result()
		rc.Close()
		if err != nil || len(keys) > 0 {
			t.Fatalf("with --set redis.db=3, %d keys of the child left in db %d: %v %v", len(keys), db, keys, err)
		}
	}
	// The keys that keep the child apart from a real deployment are the
	// bench's: overriding one could load and clean up someone's namespace.
	for _, kv := range []string{"namespace=prod", "Subject=delayd", "intake.stream.name=DELAYD_INTAKE", "redis.addrs=10.0.0.1:6379", "redis.db=1", "redis.tls.ca_file=x"} {
		out, err = exec.Command(bin, append(args, "--child-set", kv)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "the bench sets it itself") {
			t.Fatalf("--child-set %s: err %v\n%s", kv, err, out)
		}
	}
	if out, err = exec.Command(bin, append(args, "--child-set", "novalue")...).CombinedOutput(); err == nil || !strings.Contains(string(out), "want KEY=VALUE") {
		t.Fatalf("--child-set without =: err %v\n%s", err, out)
	}
}
