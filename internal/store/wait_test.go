package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testutil"
)

// waits records what the store reports of its waits.
type waits struct {
	mu    sync.Mutex
	n     map[string]int
	short map[string]int
	took  []time.Duration
}

func (w *waits) Waited(op string, took time.Duration, short bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n == nil {
		w.n, w.short = map[string]int{}, map[string]int{}
	}
	w.n[op]++
	if short {
		w.short[op]++
	}
	w.took = append(w.took, took)
}

func (w *waits) get(op string) (n, short int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n[op], w.short[op]
}

// replicated is a master with one replica and a store that waits for it.
func replicated(t *testing.T, timeout time.Duration) (*Store, *testutil.Redis, *testutil.Redis, *waits) {
	t.Helper()
	m := testutil.StartRedis(t)
	r := testutil.StartReplica(t, m)
	obs := &waits{}
	s := New(NewClient(Options{Addrs: []string{m.Addr}, WaitTimeout: timeout}), "w", 4,
		WithWait(WaitOptions{Replicas: 1, Timeout: timeout, Observer: obs}))
	t.Cleanup(func() { s.Close() })
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s, m, r, obs
}

// commandCalls reads how often Redis ran cmd (INFO commandstats).
func commandCalls(t *testing.T, c *redis.Client, cmd string) int {
	t.Helper()
	info := c.Info(context.Background(), "commandstats").Val()
	for _, line := range strings.Split(info, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
			return n
		}
	}
	return 0
}

// With wait_replicas 1: a write the replica confirmed succeeds, and one it
// did not (the replica stopped) is reported as not replicated, an unknown
// outcome, though it is on the master and its due time is known. One WAIT
// runs per pipeline, however many envelopes and shards it holds.
func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	s, m, r, obs := replicated(t, 200*time.Millisecond)
	ctx := context.Background()
	mc, rc := m.Client(), r.Client()

	items := make([]Item, 40)
	for i := range items {
		items[i] = Item{ID: "a" + strconv.Itoa(i), DelayMicros: 3600e6, Data: enc("x")}
	}
	waitsBefore := commandCalls(t, mc, "wait")
	schedule(t, s, items...)
	if n := commandCalls(t, mc, "wait") - waitsBefore; n != 1 {
		t.Errorf("%d WAITs for one pipeline of 40 envelopes over 4 shards, want 1", n)
	}
	// Confirmed means on the replica now, not in a moment.
	for sh := range 4 {
		if rc.HLen(ctx, s.keys[sh].data).Val() == 0 {
			t.Errorf("shard %d: nothing on the replica right after a confirmed schedule", sh)
		}
	}

	r.Pause()
	due, errs := s.Schedule(ctx, []Item{{ID: "b", DelayMicros: 3600e6, Data: enc("y")}})
	if !errors.Is(errs[0], ErrNotReplicated) || !errors.Is(errs[0], ErrOutcomeUnknown) {
		t.Fatalf("schedule with the replica stopped: %v, want ErrNotReplicated (an unknown outcome)", errs[0])
	}
	if due[0].Kind != Stored || due[0].DueMs <= 0 {
		t.Errorf("an unconfirmed schedule: %+v, want it stored with its due time", due[0])
	}
	if mc.HExists(ctx, s.keys[s.Shard("b")].data, "b").Val() != true {
		t.Error("the unconfirmed envelope is not on the master")
	}
	if _, err := s.Cancel(ctx, "a1"); !errors.Is(err, ErrNotReplicated) {
		t.Errorf("cancel with the replica stopped: %v, want ErrNotReplicated", err)
	}
	// Claims are handed out all the same, marked.
	schedule2 := func() {
		if _, errs := s.Schedule(ctx, []Item{{ID: "due", Absolute: true, AtMicros: 1, Data: enc("z")}}); errs[0] == nil {
			t.Error("schedule confirmed with the replica stopped")
		}
	}
	schedule2()
	time.Sleep(2 * time.Millisecond)
	res, err := s.Claim(ctx, []int{0, 1, 2, 3}, ClaimOptions{Batch: 10, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for _, cr := range res {
		got += len(cr.Items)
		if !cr.Unconfirmed || !errors.Is(cr.Why, ErrNotReplicated) {
			t.Errorf("shard %d: claim not marked unconfirmed with the replica stopped (%v)", cr.Shard, cr.Why)
		}
	}
	if got != 1 {
		t.Errorf("claimed %d with the replica stopped, want the 1 due", got)
	}
	if !s.probing[OpClaim].short.Load() {
		t.Fatal("a short claim was not noted")
	}
	// While claims fall short, the next ones do not wait (one probe a
	// second does), so a missing replica does not slow every delivery.
	all := []int{0, 1, 2, 3}
	waitsBefore = commandCalls(t, mc, "wait")
	res, err = s.Claim(ctx, all, ClaimOptions{Batch: 10, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if n := commandCalls(t, mc, "wait") - waitsBefore; n != 0 || !res[0].Unconfirmed || !errors.Is(res[0].Why, errNotWaited) {
		t.Errorf("claim right after a short one: %d WAITs, unconfirmed %v (%v); want none, unconfirmed", n, res[0].Unconfirmed, res[0].Why)
	}
	s.probing[OpClaim].lastProbe.Store(0) // the probe is due
	if res, _ = s.Claim(ctx, all, ClaimOptions{Batch: 10, Lease: time.Minute}); commandCalls(t, mc, "wait")-waitsBefore != 1 ||
		!errors.Is(res[0].Why, ErrNotReplicated) || errors.Is(res[0].Why, errNotWaited) {
		t.Errorf("the probe did not wait, or was confirmed with the replica stopped: %v", res[0].Why)
	}

	r.Resume()
	testutil.WaitReplicas(t, m, 1, 5*time.Second)
	if _, errs := s.Schedule(ctx, []Item{{ID: "b", DelayMicros: 3600e6, Data: enc("y")}}); errs[0] != nil {
		t.Errorf("schedule after the replica is back: %v", errs[0])
	}
	// The earlier cancel removed it on the master: not found now.
	if c, err := s.Cancel(ctx, "a1"); err != nil || c.Existed {
		t.Errorf("cancel after the replica is back: %+v, %v; want not found", c, err)
	}
	s.probing[OpClaim].lastProbe.Store(0) // the probe is due
	res, err = s.Claim(ctx, all, ClaimOptions{Batch: 10, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for _, cr := range res {
		if cr.Unconfirmed {
			t.Errorf("shard %d: claim unconfirmed with the replica back: %v", cr.Shard, cr.Why)
		}
	}
	if s.probing[OpClaim].short.Load() {
		t.Error("a confirmed claim did not restore the full wait")
	}
	for _, op := range []string{"schedule", "cancel", "claim"} {
		n, short := obs.get(op)
		if n == 0 || short == 0 || short == n {
			t.Errorf("%s: %d waits, %d short; want some of each", op, n, short)
		}
	}
}

// A call that writes nothing (a stream message stored already, a cancel
// of an id not stored) is not confirmed while the write it stands for (an
// earlier try, not confirmed) is only on the master, even from a daemon
// with fresh connections. (Redis 7.0 moves every connection's offset along
// with the master's, so this holds there even without the fence; the fence
// is for servers that count only a connection's own writes, see wait.go.)
func TestWaitFencesCallsThatWriteNothing(t *testing.T) {
	t.Parallel()
	s, m, r, _ := replicated(t, 200*time.Millisecond)
	ctx := context.Background()
	msg := Item{ID: "s1", DelayMicros: 3600e6, Data: enc("x"), StreamMsg: "7@1"}
	schedule(t, s, Item{ID: "c1", DelayMicros: 3600e6, Data: enc("x")})
	r.Pause()
	if _, errs := s.Schedule(ctx, []Item{msg}); !errors.Is(errs[0], ErrNotReplicated) {
		t.Fatalf("first delivery of the stream message: %v, want ErrNotReplicated", errs[0])
	}
	if _, err := s.Cancel(ctx, "c1"); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("cancel with the replica stopped: %v, want ErrNotReplicated", err)
	}
	// The redelivery, and a retried cancel, from a daemon with fresh
	// connections.
	s2 := New(NewClient(Options{Addrs: []string{m.Addr}, WaitTimeout: 200 * time.Millisecond}), "w", 4,
		WithWait(WaitOptions{Replicas: 1, Timeout: 200 * time.Millisecond}))
	defer s2.Close()
	due, errs := s2.Schedule(ctx, []Item{msg})
	if due[0].Kind != StoredBefore {
		t.Fatalf("redelivery stored again (%+v)", due[0])
	}
	if !errors.Is(errs[0], ErrNotReplicated) {
		t.Errorf("redelivery of a message stored but not replicated: %v, want ErrNotReplicated", errs[0])
	}
	s3 := New(NewClient(Options{Addrs: []string{m.Addr}, WaitTimeout: 200 * time.Millisecond}), "w", 4,
		WithWait(WaitOptions{Replicas: 1, Timeout: 200 * time.Millisecond}))
	defer s3.Close()
	if c, err := s3.Cancel(ctx, "c1"); !errors.Is(err, ErrNotReplicated) {
		t.Errorf("retried cancel, the first one not replicated: %+v %v, want ErrNotReplicated", c, err)
	}
	r.Resume()
	testutil.WaitReplicas(t, m, 1, 5*time.Second)
	if due, errs := s2.Schedule(ctx, []Item{msg}); due[0].Kind != StoredBefore || errs[0] != nil {
		t.Errorf("redelivery once replicated: %+v, %v; want stored before, nil", due[0], errs[0])
	}
}

// Under Cluster, each master the batch wrote to gets its own WAIT, on the
// connection of its writes: a stopped replica makes only its master's
// shards unconfirmed.
func TestWaitCluster(t *testing.T) {
	t.Parallel()
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip("starts a 6-node cluster")
	}
	cl := testutil.StartRedisCluster(t)
	for _, n := range cl.Nodes {
		if role, _ := n.Client().Do(context.Background(), "ROLE").Slice(); len(role) > 0 && role[0] == "master" {
			testutil.FastReplication(t, n)
			testutil.WaitReplicas(t, n, 1, 20*time.Second)
		}
	}
	obs := &waits{}
	const shards = 12
	s := New(NewClient(Options{Addrs: cl.Addrs(), WaitTimeout: 300 * time.Millisecond}), "wc", shards,
		WithWait(WaitOptions{Replicas: 1, Timeout: 300 * time.Millisecond, Observer: obs}))
	defer s.Close()
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	// The master of shard 0 and its replica.
	slot := int(s.rdb.(*redis.ClusterClient).ClusterKeySlot(ctx, s.keys[0].due).Val())
	master := cl.MasterOf(t, slot)
	var replica *testutil.Redis
	for _, n := range cl.Nodes {
		role, _ := n.Client().Do(ctx, "ROLE").Slice()
		if len(role) > 2 && role[0] == "slave" && fmt.Sprintf("%v:%v", role[1], role[2]) == master.Addr {
			replica = n
		}
	}
	if replica == nil {
		t.Fatalf("no replica of %s", master.Addr)
	}
	onMaster := map[int]bool{}
	for sh := range shards {
		sl := int(s.rdb.(*redis.ClusterClient).ClusterKeySlot(ctx, s.keys[sh].due).Val())
		onMaster[sh] = cl.MasterOf(t, sl) == master
	}
	var items []Item
	for i := range 200 {
		items = append(items, Item{ID: "k" + strconv.Itoa(i), Absolute: true, AtMicros: 1, Data: enc("x")})
	}
	waitsBefore := map[*testutil.Redis]int{}
	for _, n := range cl.Nodes {
		waitsBefore[n] = commandCalls(t, n.Client(), "wait")
	}
	schedule(t, s, items...)
	for _, n := range cl.Nodes {
		role, _ := n.Client().Do(ctx, "ROLE").Slice()
		got := commandCalls(t, n.Client(), "wait") - waitsBefore[n]
		if want := map[bool]int{true: 1, false: 0}[len(role) > 0 && role[0] == "master"]; got != want {
			t.Errorf("node %s (%v) ran %d WAITs for one schedule pipeline, want %d", n.Addr, role[0], got, want)
		}
	}

	replica.Pause()
	defer replica.Resume()
	_, errs := s.Schedule(ctx, items)
	for i, it := range items {
		sh := s.Shard(it.ID)
		if short := errors.Is(errs[i], ErrNotReplicated); short != onMaster[sh] {
			t.Errorf("%s (shard %d, on the paused replica's master: %v): %v", it.ID, sh, onMaster[sh], errs[i])
		}
	}
	all := make([]int, shards)
	for i := range all {
		all[i] = i
	}
	res, err := s.Claim(ctx, all, ClaimOptions{Batch: 100, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	claimed := 0
	for _, r := range res {
		claimed += len(r.Items)
		if r.Unconfirmed != onMaster[r.Shard] {
			t.Errorf("claim of shard %d unconfirmed %v, on the paused replica's master %v", r.Shard, r.Unconfirmed, onMaster[r.Shard])
		}
	}
	if claimed != len(items) {
		t.Errorf("claimed %d of %d with one replica stopped", claimed, len(items))
	}
}

// A fence that fails (here the ACL refuses SET, which only the fence
// uses) leaves unconfirmed only what wrote nothing, which its wait was to
// cover: a stream redelivery stored already, a cancel of an id not
// stored. What the same call wrote is confirmed by the wait as before.
func TestWaitFailedFenceLeavesOnlyWhatWroteNothingUnconfirmed(t *testing.T) {
	t.Parallel()
	m := testutil.StartRedis(t)
	testutil.StartReplica(t, m)
	ctx := context.Background()
	if err := m.Client().Do(ctx, "ACL", "SETUSER", "nofence", "on", ">pw", "~*", "&*", "+@all", "-set").Err(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitReplicas(t, m, 1, 5*time.Second)
	s := New(NewClient(Options{Addrs: []string{m.Addr}, Username: "nofence", Password: "pw", WaitTimeout: time.Second}), "f", 4,
		WithWait(WaitOptions{Replicas: 1, Timeout: time.Second}))
	defer s.Close()
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	msg := Item{ID: "s1", DelayMicros: 3600e6, Data: enc("x"), StreamMsg: "7@1"}
	if _, errs := s.Schedule(ctx, []Item{msg}); errs[0] != nil {
		t.Fatalf("first delivery of the stream message (written, its fence refused): %v", errs[0])
	}
	due, errs := s.Schedule(ctx, []Item{msg, {ID: "n1", DelayMicros: 3600e6, Data: enc("x")}})
	if due[0].Kind != StoredBefore || !errors.Is(errs[0], ErrNotReplicated) || !strings.Contains(errs[0].Error(), "fence") {
		t.Errorf("redelivery with its fence refused: %+v, %v; want 0 and the fence's ErrNotReplicated", due[0], errs[0])
	}
	if due[1].Kind != Stored || errs[1] != nil {
		t.Errorf("a new envelope in the same call: %+v, %v; want stored and confirmed", due[1], errs[1])
	}
	if _, err := s.Cancel(ctx, "nosuch"); !errors.Is(err, ErrNotReplicated) {
		t.Errorf("cancel of an id not stored, its fence refused: %v, want ErrNotReplicated", err)
	}
	if c, err := s.Cancel(ctx, "n1"); err != nil || !c.Existed {
		t.Errorf("cancel of a stored id: %+v, %v; want removed and confirmed", c, err)
	}
}

// Each operation waits for the replicas exactly as its policy in ops.go
// says: one WAIT per pipeline for those that wait, none for the others.
// An operation added to the table must be added here too.
func TestWaitOnlyWhereThePolicySays(t *testing.T) {
	t.Parallel()
	s, m, _, obs := replicated(t, time.Second)
	testutil.WaitReplicas(t, m, 1, 5*time.Second)
	ctx := context.Background()
	schedule(t, s, Item{ID: "d", Absolute: true, AtMicros: 1000, Data: enc("x")})
	var claimed Claimed
	run := map[string]func() error{
		OpSchedule: func() error {
			_, errs := s.Schedule(ctx, []Item{{ID: "a", Absolute: true, AtMicros: 1000, Data: enc("x")}})
			return errs[0]
		},
		OpCancel: func() error { _, err := s.Cancel(ctx, "a"); return err },
		OpClaim: func() error {
			res, err := s.Claim(ctx, []int{s.Shard("d")}, ClaimOptions{Batch: 1, Lease: time.Minute})
			if err == nil && len(res) == 1 && len(res[0].Items) == 1 {
				claimed = res[0].Items[0]
			}
			return err
		},
		OpAck: func() error {
			_, err := s.Ack(ctx, map[int][]Settle{s.Shard("d"): {{ID: "d", Token: claimed.Token, Outcome: Bury}}}, 0)
			return err
		},
		replayOp:      func() error { _, err := s.Replay(ctx, []string{"d"}); return err },
		purgeOp:       func() error { _, err := s.Purge(ctx, []string{"d"}); return err },
		checkOp:       func() error { _, err := s.Check(ctx, 0, CheckOptions{Repair: true}); return err },
		heartbeatOp:   func() error { _, _, err := s.Heartbeat(ctx, "me", time.Minute); return err },
		formatsOp:     func() error { _, err := s.AgreeFormats(ctx, "me", time.Minute); return err },
		ownOp:         func() error { _, err := s.Own(ctx, "me", time.Minute, []int{0}, nil); return err },
		intakeFloorOp: func() error { return s.SaveIntakeFloor(ctx, "stream", 1, 5) },
		reserveOp: func() error {
			l := Limit{Pattern: "w.>", Rate: "1/h", IntervalUs: 3600e6, Burst: 1}
			if err := s.SetLimit(ctx, l); err != nil {
				return err
			}
			_, _, err := s.Reserve(ctx, l, []string{"r1", "r2"}, []int64{1, 1})
			return err
		},
		releaseOp: func() error { _, _, err := s.RemoveLimit(ctx, "w.>"); return err },
	}
	order := []string{OpSchedule, OpCancel, OpClaim, OpAck, replayOp, purgeOp, checkOp, heartbeatOp, formatsOp, ownOp, intakeFloorOp,
		reserveOp, releaseOp}
	for op := range policies {
		if run[op] == nil || !slices.Contains(order, op) {
			t.Errorf("operation %s is not exercised here", op)
		}
	}
	for _, op := range order {
		before := commandCalls(t, m.Client(), "wait")
		n0, _ := obs.get(op)
		if err := run[op](); err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		n, short := obs.get(op)
		waited := commandCalls(t, m.Client(), "wait") - before
		want := 0
		if policies[op].wait != neverWaits {
			want = 1
		}
		if waited != want || n-n0 != want || short != 0 {
			t.Errorf("%s (%v): %d WAITs sent, %d observed (%d short); want %d", op, policies[op].wait, waited, n-n0, short, want)
		}
	}
}
