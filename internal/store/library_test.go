package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/delayd/delayd/internal/testutil"
	"github.com/redis/go-redis/v9"
)

// fcalls reads how many FCALLs the server ran, and how many of them
// failed (INFO commandstats).
func fcalls(t *testing.T, r *testutil.Redis) (calls, failed int) {
	t.Helper()
	info, err := r.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_fcall:")
		if !ok {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			n, _ := strconv.Atoi(v)
			switch k {
			case "calls":
				calls = n
			case "failed_calls":
				failed = n
			}
		}
	}
	return calls, failed
}

// After FUNCTION FLUSH, a schedule, a claim and an ack each find their
// function gone, load the library and resend each call that failed,
// once: as many calls ran as failed.
func TestFunctionFlushReload(t *testing.T) {
	t.Parallel()
	s, r := newStore(t)
	ctx := context.Background()
	flushed := func(what string, op func()) {
		t.Helper()
		if err := r.Client().FunctionFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		calls0, failed0 := fcalls(t, r)
		op()
		calls, failed := fcalls(t, r)
		if ran := calls - failed - (calls0 - failed0); failed == failed0 || ran != failed-failed0 {
			t.Fatalf("%s after FUNCTION FLUSH: %d calls failed, %d ran; want some failed, each run once", what, failed-failed0, ran)
		}
	}
	var items []Item
	for i := range 8 {
		items = append(items, Item{ID: fmt.Sprintf("f%d", i), Data: enc("x")})
	}
	flushed("schedule", func() { schedule(t, s, items...) })
	var got map[string]Claimed
	flushed("claim", func() { got = claimAll(t, s, time.Minute) })
	if len(got) != len(items) {
		t.Fatalf("claimed %d of %d", len(got), len(items))
	}
	settles := map[int][]Settle{}
	for _, c := range got {
		settles[s.Shard(c.ID)] = append(settles[s.Shard(c.ID)], Settle{ID: c.ID, Token: c.Token, Outcome: Delivered})
	}
	flushed("ack", func() {
		if ackd, err := s.Ack(ctx, settles, time.Hour); err != nil || ackd.Settled != len(items) {
			t.Fatalf("ack: settled %d (%v), want %d", ackd.Settled, err, len(items))
		}
	})
	if err := r.Client().FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.libraryLoaded(ctx); err != nil || !ok {
		t.Fatalf("Ready after FUNCTION FLUSH did not reload the library: %v %v", ok, err)
	}
	mustBeConsistent(t, s)
}

// Two versions of delayd on one Redis, each with its library (another
// version's stands in as the library with one more line): both load, run
// on the same data, and reload only their own after FUNCTION FLUSH.
func TestTwoLibraryVersions(t *testing.T) {
	t.Parallel()
	r := testutil.StartRedis(t)
	ctx := context.Background()
	old := storeOn(t, r)
	next := New(NewClient(Options{Addrs: []string{r.Addr}}), "t", 4)
	t.Cleanup(func() { next.Close() })
	next.lib = newLibrary(old.lib.scripts, "\n-- the next version\n")
	if err := next.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if old.lib.name == next.lib.name {
		t.Fatal("two sources, one library name")
	}
	// A third daemon, of the old version: its library is there already.
	storeOn(t, r)
	libs, err := r.Client().FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "delayd_*"}).Result()
	if err != nil || len(libs) != 2 {
		t.Fatalf("libraries on the server: %+v %v, want both", libs, err)
	}
	for round := range 2 {
		a, b := fmt.Sprintf("old%d", round), fmt.Sprintf("next%d", round)
		schedule(t, old, Item{ID: a, Data: enc("x")})
		schedule(t, next, Item{ID: b, Data: enc("y")})
		got := claimAll(t, next, time.Minute)
		if len(got) != 2 {
			t.Fatalf("round %d: the next version claimed %+v", round, got)
		}
		for _, c := range got {
			if settle(t, old, c, Delivered, 0) != 1 {
				t.Fatalf("round %d: the old version did not settle %s", round, c.ID)
			}
		}
		if err := r.Client().FunctionFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	mustBeConsistent(t, old)
	mustBeConsistent(t, next)
}

// The embedded emulation has no functions: the store finds out at its
// first call (delayd doctor sends one without Ping) or load (Ready's
// here), and sends scripts from then on.
func TestNoFunctionsOnTheEmulation(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	ctx := context.Background()
	first := New(NewClient(Options{Addrs: []string{mr.Addr()}}), "e", 4)
	defer first.Close()
	schedule(t, first, Item{ID: "e1", Data: enc("x")})
	s := New(NewClient(Options{Addrs: []string{mr.Addr()}}), "e", 4)
	defer s.Close()
	if err := s.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Store{first, s} {
		if !s.noFunctions.Load() {
			t.Fatal("the emulation taken for a server with functions")
		}
	}
	schedule(t, s, Item{ID: "e2", Data: enc("y")})
	got := claimAll(t, s, time.Minute)
	if len(got) != 2 {
		t.Fatalf("claimed %+v", got)
	}
	for _, c := range got {
		if settle(t, s, c, Delivered, 0) != 1 {
			t.Fatalf("%s not settled", c.ID)
		}
	}
	mustBeConsistent(t, s)
}
