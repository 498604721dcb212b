package systest

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/internal/daemon"
	"github.com/delayd/delayd/internal/daemon/daemontest"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/testutil"
)

// waitSchedule sends one schedule request with id and returns the error
// code ("" for success) and the 504 body's id.
func waitSchedule(t *testing.T, nc *nats.Conn, id, target string, at time.Time) (code, bodyID string) {
	t.Helper()
	m := &nats.Msg{Subject: "delayd.schedule", Data: []byte(id),
		Header: daemontest.Hdr("Delayd-Target", target, "Delayd-Id", id, "Delayd-At", at.UTC().Format(time.RFC3339Nano))}
	rep, err := nc.RequestMsg(m, 5*time.Second)
	if err != nil {
		return "timeout", ""
	}
	var body struct{ ID string }
	_ = json.Unmarshal(rep.Data, &body)
	return rep.Header.Get(micro.ErrorCodeHeader), body.ID
}

// answers schedules ids concurrently (8 at a time) and returns each id's
// code.
func answers(t *testing.T, nc *nats.Conn, ids []string, target string, at func(i int) time.Time) map[string]string {
	t.Helper()
	var mu sync.Mutex
	out := map[string]string{}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(ids); i += 8 {
				code, bodyID := waitSchedule(t, nc, ids[i], target, at(i))
				if code == "504" && bodyID != ids[i] {
					t.Errorf("%s: 504 without its id (%q)", ids[i], bodyID)
				}
				mu.Lock()
				out[ids[i]] = code
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

func countCode(answers map[string]string, code string) int {
	n := 0
	for _, c := range answers {
		if c == code {
			n++
		}
	}
	return n
}

func idsOf(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + "-" + string(rune('a'+i/26%26)) + string(rune('a'+i%26))
	}
	return out
}

// With wait_replicas 1 and the replica stopped (SIGSTOP), a schedule gets
// 504 with its id, not 200, and so does a cancel; deliveries go on (the
// claims' waits fall short, and they are published anyway). After SIGCONT
// the same schedule gets 200.
func TestWaitReplicasStoppedReplica(t *testing.T) {
	t.Parallel()
	m := testutil.StartRedis(t)
	r := testutil.StartReplica(t, m)
	e := &daemontest.Env{T: t, Redis: m, NATS: testutil.StartNATS(t)}
	c := e.Config()
	c.Redis.WaitReplicas, c.Redis.WaitTimeout = 1, 300*time.Millisecond
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	got := e.Sink(nc, "wait.a")

	if code, _ := waitSchedule(t, nc, "early", "wait.a", time.Now().Add(1500*time.Millisecond)); code != "" {
		t.Fatalf("schedule with the replica up: %q, want 200", code)
	}
	r.Pause()
	paused := time.Now()
	if code, id := waitSchedule(t, nc, "during", "wait.a", time.Now().Add(time.Second)); code != "504" || id != "during" {
		t.Fatalf("schedule with the replica stopped: code %q id %q, want 504 with the id", code, id)
	}
	cm := nats.NewMsg("delayd.cancel")
	cm.Header.Set("Delayd-Id", "early-not-there")
	if rep, err := nc.RequestMsg(cm, 5*time.Second); err != nil || rep.Header.Get(micro.ErrorCodeHeader) != "504" {
		t.Errorf("cancel with the replica stopped: %v %v, want 504", err, rep)
	}
	// Acknowledged before the stop and due during it: delivered; and so
	// is the one that got 504 (it is on the master, which did not fail).
	got.WaitCount(2, 5*time.Second)
	if len(got.Get("early")) == 0 || len(got.Get("during")) == 0 {
		t.Fatalf("envelopes due while the replica is stopped were not delivered (got %d)", got.Count())
	}
	t.Logf("delivered %s after the replica stopped", time.Since(paused).Round(time.Millisecond))
	r.Resume()
	testutil.WaitReplicas(t, m, 1, 10*time.Second)
	if code, _ := waitSchedule(t, nc, "during", "wait.a", time.Now().Add(500*time.Millisecond)); code != "" {
		t.Fatalf("schedule after SIGCONT: %q, want 200", code)
	}
	got.WaitCount(3, 5*time.Second)
	if len(got.Get("during")) != 2 {
		t.Error("the envelope acknowledged after SIGCONT was not delivered")
	}
	mm := scrape(t, c.HTTP.Addr)
	if mm[`delayd_redis_wait_short_total{op="schedule"}`] < 1 || mm[`delayd_redis_wait_short_total{op="claim"}`] < 1 ||
		mm[`delayd_redis_wait_short_total{op="cancel"}`] < 1 {
		t.Errorf("short waits not counted: %v %v %v", mm[`delayd_redis_wait_short_total{op="schedule"}`],
			mm[`delayd_redis_wait_short_total{op="claim"}`], mm[`delayd_redis_wait_short_total{op="cancel"}`])
	}
}

// wait_local_fsync needs WAITAOF (Redis 7.2): on an older server the
// daemon refuses to start, saying so.
func TestWaitLocalFsyncRefusedWithoutWAITAOF(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t, "--appendonly", "yes")
	if v := e.Redis.Client().Info(context.Background(), "server").Val(); !strings.Contains(v, "redis_version:7.0") &&
		!strings.Contains(v, "redis_version:6.") && !strings.Contains(v, "redis_version:7.1") {
		t.Skip("this redis-server has WAITAOF")
	}
	c := e.Config()
	c.Redis.WaitLocalFsync = true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := daemon.New(c, hclog.NewNullLogger()).Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "WAITAOF") || !strings.Contains(err.Error(), "7.2") ||
		!strings.Contains(err.Error(), "redis.wait_local_fsync") {
		t.Fatalf("want a refusal naming WAITAOF, Redis 7.2 and the setting, got %v", err)
	}
	t.Log(err)
}

// sentinelWithWait is a Sentinel set-up whose replica acknowledges within
// a second, and a daemon on it with wait_replicas 1.
func sentinelWithWait(t *testing.T) (*testutil.Sentinel, *daemontest.Env, string) {
	sn := testutil.StartSentinel(t)
	testutil.FastReplication(t, sn.Master)
	testutil.WaitReplicas(t, sn.Master, 1, 15*time.Second)
	e := &daemontest.Env{T: t, Redis: sn.Replica, NATS: testutil.StartNATS(t)}
	c := e.Config()
	c.Redis.Addrs = []string{sn.Addr}
	c.Redis.MasterName = "mymaster"
	c.Redis.WaitReplicas, c.Redis.WaitTimeout = 1, 300*time.Millisecond
	e.StartDaemon(c)
	return sn, e, c.HTTP.Addr
}

func waitFailover(t *testing.T, sn *testutil.Sentinel, to string) {
	t.Helper()
	testutil.Wait(t, 30*time.Second, "a failover to "+to, func() bool { return sn.MasterAddr(t) == to })
}

// A Sentinel failover with a stopped replica (the reproduction):
// the replica is stopped and its link filled with a 30 MB write, so what
// the master writes next stays in the master's buffers; then the master is
// killed and the replica promoted. Without the wait the schedules
// acknowledged meanwhile are lost; with it they got 504, and every
// envelope that got 200 arrives.
func TestWaitSentinelFailoverStoppedReplica(t *testing.T) {
	t.Parallel()
	sn, e, _ := sentinelWithWait(t)
	nc := e.Conn()
	defer nc.Close()
	got := e.Sink(nc, "wf.x")
	due := time.Now().Add(15 * time.Second)
	at := func(int) time.Time { return due }

	before := answers(t, nc, idsOf("before", 100), "wf.x", at)
	sn.Replica.Pause()
	if err := sn.Master.Client().Set(context.Background(), "flood", strings.Repeat("x", 30<<20), 0).Err(); err != nil {
		t.Fatal(err)
	}
	during := answers(t, nc, idsOf("during", 50), "wf.x", at)
	sn.Master.Kill()
	sn.Replica.Resume()
	failedOver := time.Now()
	waitFailover(t, sn, sn.Replica.Addr)
	t.Logf("failover in %s", time.Since(failedOver).Round(100*time.Millisecond))

	acked, unknown := []string{}, 0
	for _, set := range []map[string]string{before, during} {
		for id, code := range set {
			switch code {
			case "":
				acked = append(acked, id)
			case "504":
				unknown++
			default:
				t.Errorf("%s: answered %q, want 200 or 504", id, code)
			}
		}
	}
	for id, code := range before {
		if code != "" {
			t.Errorf("%s, scheduled with the replica up: %q, want 200", id, code)
		}
	}
	if unknown == 0 {
		t.Error("no schedule got 504 while the replica was stopped: the test proves nothing")
	}
	got.WaitCount(len(acked), time.Until(due)+20*time.Second)
	daemontest.Quiet(t, e, e.Config(), got)
	lost := 0
	for _, id := range acked {
		if len(got.Get(id)) == 0 {
			lost++
		}
	}
	lateDelivered := 0
	for id, code := range during {
		if code == "504" && len(got.Get(id)) > 0 {
			lateDelivered++
		}
	}
	t.Logf("%d acknowledged (200), %d answered 504 (%d of them delivered anyway), %d lost", len(acked), unknown, lateDelivered, lost)
	if lost > 0 {
		t.Errorf("%d of %d envelopes acknowledged with 200 were lost in the failover", lost, len(acked))
	}
}

// A clean failover (the replica up to date) that leaves the new master
// without a replica: nothing acknowledged is lost, and deliveries go on
// though no claim can be confirmed any more; new schedules get 504 and are
// delivered all the same (they are on the master).
func TestWaitCleanFailoverNoReplicaLeft(t *testing.T) {
	t.Parallel()
	sn, e, httpAddr := sentinelWithWait(t)
	nc := e.Conn()
	defer nc.Close()
	got := e.Sink(nc, "wc.x")
	start := time.Now().Add(time.Second)
	ids := idsOf("c", 100)
	due := func(i int) time.Time { return start.Add(time.Duration(i) * 80 * time.Millisecond) }
	first := answers(t, nc, ids, "wc.x", due)
	// With the replica up, a 504 is a replica ack slower than the 300 ms
	// wait on a loaded machine (seen once under CI's -race): the client's
	// resend with the same id must then get its 200.
	for try := 0; try < 3; try++ {
		var again []string
		for _, id := range ids {
			if first[id] == "504" {
				again = append(again, id)
			}
		}
		if len(again) == 0 {
			break
		}
		maps.Copy(first, answers(t, nc, again, "wc.x", func(i int) time.Time { return due(slices.Index(ids, again[i])) }))
	}
	for id, code := range first {
		if code != "" {
			t.Fatalf("%s: %q with the replica up, want 200", id, code)
		}
	}
	time.Sleep(time.Until(start.Add(2 * time.Second)))
	sn.Master.Kill()
	waitFailover(t, sn, sn.Replica.Addr)
	// The daemon follows the failover within a moment; until then a
	// schedule gets 503 (nothing written) and is retried.
	var after map[string]string
	testutil.Eventually(10*time.Second, func() bool {
		after = answers(t, nc, idsOf("after", 20), "wc.x", func(int) time.Time { return time.Now().Add(500 * time.Millisecond) })
		return !slices.Contains(slices.Collect(maps.Values(after)), "503")
	})
	t.Logf("after the failover, without a replica: %d schedules answered 504", countCode(after, "504"))
	for id, code := range after {
		if code != "504" && code != "" {
			t.Errorf("%s after the failover: %q, want 504 (no replica left) or 200", id, code)
		}
	}
	// Every id, not a count: a duplicate after the failover must not end
	// the wait before the last one arrived. A loaded CI machine fails over
	// slowly.
	all := append(ids, idsOf("after", 20)...)
	got.WaitIDs(all, 45*time.Second)
	for _, id := range all {
		if len(got.Get(id)) == 0 {
			t.Errorf("%s not delivered", id)
		}
	}
	if short := scrape(t, httpAddr)[`delayd_redis_wait_short_total{op="claim"}`]; short < 1 {
		t.Errorf("no claim counted short on a master without a replica (%v)", short)
	}
}

// The stream intake acks a message only once the replicas confirmed it:
// with the replica stopped it stays in the stream (offered again, the same
// id replacing), and it is acked, and delivered once, after SIGCONT.
func TestWaitStreamIntakeAcksOnlyReplicated(t *testing.T) {
	t.Parallel()
	m := testutil.StartRedis(t)
	r := testutil.StartReplica(t, m)
	e := &daemontest.Env{T: t, Redis: m, NATS: testutil.StartNATS(t)}
	c := e.Config()
	c.Redis.WaitReplicas, c.Redis.WaitTimeout = 1, 300*time.Millisecond
	c.Intake.Stream.RetryDelay = 200 * time.Millisecond
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	got := e.Sink(nc, "ws.x")
	js, _ := jetstream.New(nc)
	var intake jetstream.Stream
	var err error
	if !testutil.Eventually(10*time.Second, func() bool {
		intake, err = js.Stream(context.Background(), "DELAYD_INTAKE")
		return err == nil
	}) {
		t.Fatal(err)
	}
	inStream := func() uint64 {
		info, err := intake.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	r.Pause()
	if _, err := js.PublishMsg(context.Background(), &nats.Msg{Subject: "delayd.intake", Data: []byte("s1"),
		Header: daemontest.Hdr("Delayd-Target", "ws.x", "Delayd-Delay", "3s", "Delayd-Id", "s1")}); err != nil {
		t.Fatal(err)
	}
	// Several offers, each stored and not confirmed.
	if !testutil.Eventually(10*time.Second, func() bool { return offers(t, js, c.Intake.Stream.Name) >= 3 }) {
		t.Fatalf("the intake offered s1 %d times in 10 s, want 3", offers(t, js, c.Intake.Stream.Name))
	}
	if n := inStream(); n != 1 {
		t.Fatalf("%d messages in the intake stream with the replica stopped, want 1 (not acked)", n)
	}
	r.Resume()
	testutil.WaitReplicas(t, m, 1, 10*time.Second)
	testutil.Wait(t, 10*time.Second, "the message acked after SIGCONT", func() bool { return inStream() == 0 })
	got.WaitCount(1, 10*time.Second)
	daemontest.Quiet(t, e, c, got)
	if n := len(got.Get("s1")); n != 1 {
		t.Errorf("s1 delivered %d times, want once", n)
	}
}

// offers is how many times the intake stream's consumer has handed out
// messages, redeliveries included: 0 while the daemon has not made the
// consumer yet.
func offers(t *testing.T, js jetstream.JetStream, name string) uint64 {
	t.Helper()
	cons, err := js.Consumer(context.Background(), name, name)
	if err != nil {
		return 0
	}
	info, err := cons.Info(context.Background())
	if err != nil {
		return 0
	}
	return info.Delivered.Consumer
}

// Under the Redis ACL of docs/security.md (read from the file) the start-up
// check of the wait settings must refuse wait_local_fsync on a Redis
// without WAITAOF, not start with a warning that it could not check.
func TestWaitLocalFsyncRefusedUnderTheREADMEACL(t *testing.T) {
	t.Parallel()
	e := daemontest.NewEnv(t, "--appendonly", "yes")
	if v := e.Redis.Client().Info(context.Background(), "server").Val(); !strings.Contains(v, "redis_version:7.0") &&
		!strings.Contains(v, "redis_version:6.") && !strings.Contains(v, "redis_version:7.1") {
		t.Skip("this redis-server has WAITAOF")
	}
	applyDocsACL(t, e.Redis, "pw")
	c := e.Config()
	c.Redis.Username, c.Redis.Password = "delayd", "pw"
	c.Redis.WaitLocalFsync = true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := daemon.New(c, hclog.NewNullLogger()).Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "WAITAOF") {
		t.Fatalf("want a refusal naming WAITAOF under the ACL of docs/security.md, got %v", err)
	}
}

// TestWaitClaimsStrict: with redis.wait_claims: strict, a claim whose WAIT
// falls short is not published but given back uncounted, so a failover
// can never repeat an attempt number: while the replica is stopped nothing
// is delivered and the attempts stay; once it is back, the envelope goes
// out as attempt 1.
func TestWaitClaimsStrict(t *testing.T) {
	t.Parallel()
	m := testutil.StartRedis(t)
	r := testutil.StartReplica(t, m)
	e := &daemontest.Env{T: t, Redis: m, NATS: testutil.StartNATS(t)}
	c := e.Config()
	c.Redis.WaitReplicas, c.Redis.WaitTimeout = 1, 300*time.Millisecond
	c.Redis.WaitClaims = "strict"
	e.StartDaemon(c)
	nc := e.Conn()
	defer nc.Close()
	got := e.Sink(nc, "strict.a")
	testutil.WaitReplicas(t, m, 1, 10*time.Second)
	due := time.Now().Add(1500 * time.Millisecond)
	if code, _ := waitSchedule(t, nc, "strict", "strict.a", due); code != "" {
		t.Fatalf("schedule with the replica up: %q, want 200", code)
	}
	r.Pause()
	// Claimed, its wait short, given back: twice, so the scanner had its
	// chance to publish more than once.
	st := e.InspectStore(c)
	backs := 0
	for deadline, lastDue := time.Now().Add(20*time.Second), int64(0); backs < 2; time.Sleep(10 * time.Millisecond) {
		en, err := st.Get(context.Background(), "strict")
		if n := got.Count(); n > 0 {
			t.Fatalf("published while no replica confirmed its claim: %d deliveries, attempt %d", n, got.Get("strict")[0].Attempt)
		}
		if err != nil {
			t.Fatal(err)
		}
		// Get counts the attempt under way of an inflight envelope (the
		// claim being waited on): 1 then is the claim, not a counted one.
		counted := en.Attempts
		if en.State == store.StateInflight {
			counted--
		}
		if counted != 0 {
			t.Fatalf("attempt counted while no replica confirmed the claim: %+v", en)
		}
		if en.Error != "" && en.State == store.StatePending && en.DueMs != lastDue {
			backs++
			lastDue = en.DueMs
		}
		if time.Now().After(deadline) {
			t.Fatalf("not given back uncounted while the replica is stopped: %+v", en)
		}
	}
	got.Settle(t)
	if n := got.Count(); n != 0 {
		t.Fatalf("%d deliveries while no replica confirmed a claim", n)
	}
	r.Resume()
	resumed := time.Now()
	got.WaitIDs([]string{"strict"}, 20*time.Second)
	daemontest.Quiet(t, e, c, got)
	ds := got.Get("strict")
	if len(ds) != 1 || ds[0].Attempt != 1 {
		t.Fatalf("after the replica came back: %+v; want one delivery, attempt 1", ds)
	}
	t.Logf("delivered %s after the replica came back (%s after due)", ds[0].Received.Sub(resumed).Round(time.Millisecond),
		ds[0].Received.Sub(due).Round(time.Millisecond))
}
