package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/testutil"
)

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }

// TestDoctor breaks the data behind delayd's back, as a bug or an operator
// could, and checks that doctor reports each kind read-only, repairs it with
// --repair, and that a repaired envelope is then delivered.
func TestDoctor(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Shards = 2
	ctx := context.Background()
	doctor := func(args ...string) (string, error) {
		var out bytes.Buffer
		args = append([]string{"delayd", "doctor", "--redis-addrs", e.Redis.Addr, "--set", "shards=2"}, args...)
		err := run(ctx, args, func(string) string { return "" }, &out, &out)
		return out.String(), err
	}
	if out, err := doctor(); err != nil || !strings.Contains(out, "consistent") {
		t.Fatalf("empty store: %v\n%s", err, out)
	}
	stop := e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	got := e.Sink(nc, "doc.>")
	for i := range 4 {
		daemontest.ScheduleServed(t, nc, daemontest.Hdr("Delayd-Target", "doc.t", "Delayd-Delay", "1h", "Delayd-Id", fmt.Sprintf("d%d", i)))
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if out, err := doctor(); err != nil || !strings.Contains(out, "stored format 3: 4 values") {
		t.Fatalf("counts per format: %v\n%s", err, out)
	}
	st := e.InspectStore(c)
	rc := e.Redis.Client()
	k := func(id, name string) string { return fmt.Sprintf("{delayd:%d}:%s", st.Shard(id), name) }
	// d0's data without an index: it would never be delivered.
	rc.ZRem(ctx, k("d0", "due"), "d0")
	rc.ZAdd(ctx, k("d1", "dead"), redisZ(1, "d1"))      // in two indexes
	rc.HDel(ctx, k("d2", "data"), "d2")                 // an index entry without data
	rc.HSet(ctx, k("d3", "errors"), "ghost", "old err") // an error without data
	out, err := doctor()
	if err == nil {
		t.Fatalf("doctor found nothing:\n%s", out)
	}
	for _, kind := range []string{"unindexed_data", "multiply_indexed", "due_without_data", "error_without_data"} {
		if !strings.Contains(out, kind) {
			t.Errorf("doctor did not report %s:\n%s", kind, out)
		}
	}
	if again, _ := doctor(); again != out {
		t.Fatalf("read-only doctor changed something:\n%s\nthen\n%s", out, again)
	}
	// A live daemon of a build with redis.due_buckets on (it announces
	// format 4) may write the due buckets at any moment, whose ids a repair
	// would take for unindexed data and make due now: no repair then.
	live := float64(time.Now().Add(time.Minute).UnixMilli())
	rc.ZAdd(ctx, "{delayd:members}", redisZ(live, "old"))
	rc.ZAdd(ctx, "{delayd:members}:formats", redisZ(live, "4:old"))
	if out, err := doctor("--repair"); err == nil || !strings.Contains(err.Error(), "format 4") {
		t.Fatalf("repair beside a daemon writing the due buckets: %v\n%s", err, out)
	}
	if again, _ := doctor(); again != out {
		t.Fatalf("a refused repair changed something:\n%s\nthen\n%s", out, again)
	}
	rc.ZRem(ctx, "{delayd:members}", "old")
	rc.ZRem(ctx, "{delayd:members}:formats", "4:old")
	if out, err := doctor("--repair"); err != nil || !strings.Contains(out, "repaired") {
		t.Fatalf("repair: %v\n%s", err, out)
	}
	if out, err := doctor("--json"); err != nil || !strings.Contains(out, `"found": {}`) {
		t.Fatalf("after repair: %v\n%s", err, out)
	}
	// The unindexed envelope was made due now: a daemon delivers it.
	e.StartDaemon(c)
	if got.WaitCount(1, 10*time.Second) != 1 || len(got.Get("d0")) != 1 {
		t.Fatal("repaired envelope not delivered")
	}
}

// TestDoctorWhileDelivering runs the check over and over while a daemon
// delivers: an atomic page never sees a half-moved envelope, so nothing may
// be found.
func TestDoctorWhileDelivering(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t)
	c := e.Config()
	c.Shards = 4
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	got := e.Sink(nc, "busy.>")
	ids := daemontest.ScheduleMany(t, nc, 3000, 16, "busy", func(i int, h nats.Header) {
		h.Set("Delayd-Target", "busy.t")
		h.Set("Delayd-Delay", fmt.Sprintf("%dms", 200+i%1500))
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for got.Count() < len(ids) {
			var out bytes.Buffer
			args := []string{"delayd", "doctor", "--redis-addrs", e.Redis.Addr, "--set", "shards=4", "--json"}
			if err := run(context.Background(), args, func(string) string { return "" }, &out, &out); err != nil {
				t.Errorf("doctor during delivery: %v\n%s", err, out.String())
				return
			}
		}
	}()
	got.WaitCount(len(ids), 20*time.Second)
	<-done
	got.Check(t, ids)
}

// TestDoctorDayOne: what a newcomer meets first with doctor. A dead address
// is one clear error that says which flag gives the address, without the
// Redis library's own lines; --json names every field in snake_case; and
// a value that is no envelope at all is reported as unreadable, not as the
// oldest format.
func TestDoctorDayOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	doctor := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, append([]string{"delayd", "doctor", "--set", "shards=2"}, args...), func(string) string { return "" }, &out, &out)
		return out.String(), err
	}

	dead := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	out, err := doctor("--redis-addrs", dead)
	if err == nil {
		t.Fatalf("doctor against a dead address succeeded:\n%s", out)
	}
	if msg := err.Error(); !strings.Contains(msg, dead) || !strings.Contains(msg, "--redis-addrs") {
		t.Errorf("error %q: want the address and the --redis-addrs hint", msg)
	}
	if strings.Contains(out, "pool.go") || strings.Contains(out, "connection pool") {
		t.Errorf("doctor printed the Redis library's own lines:\n%s", out)
	}

	e := daemontest.NewEnv(t)
	e.Redis.Client().HSet(ctx, "{delayd:0}:data", "junk", "not an envelope")
	out, err = doctor("--redis-addrs", e.Redis.Addr)
	if err == nil {
		t.Fatalf("doctor found nothing wrong with a junk value:\n%s", out)
	}
	if strings.Contains(out, "stored format 1") || !strings.Contains(out, "unreadable") {
		t.Errorf("a junk value: want it reported unreadable, not as format 1:\n%s", out)
	}
	out, _ = doctor("--redis-addrs", e.Redis.Addr, "--json")
	var v any
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	snake := regexp.MustCompile(`^[a-z0-9_]+$`)
	var walk func(any)
	walk = func(v any) {
		if m, ok := v.(map[string]any); ok {
			for k, x := range m {
				if !snake.MatchString(k) {
					t.Errorf("--json field %q is not snake_case:\n%s", k, out)
				}
				walk(x)
			}
		}
	}
	walk(v)
	if !strings.Contains(out, `"unreadable": 1`) {
		t.Errorf("--json: want \"unreadable\": 1:\n%s", out)
	}
}
