package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/envelope"
	"github.com/delayd/delayd/internal/testutil"
)

// bareValue is an envelope as the builds before the value header stored
// it (format 1): the envelope's format byte, 8 version bytes, the target,
// no headers, the payload.
var bareValue = []byte("\x01\x00\x00\x00\x00\x00\x00\x00\x00\x03x.y\x00p")

// putOld writes id as a retired format laid it out, with redis commands:
// value v in data, score in set (due, inflight or dead), and the attempts
// value a ("" for none).
func putOld(t *testing.T, s *Store, id string, v []byte, set string, score float64, a string) {
	t.Helper()
	ctx := context.Background()
	k := s.keys[s.Shard(id)]
	key := map[string]string{"due": k.due, "inflight": k.inflight, "dead": k.dead}[set]
	if err := s.rdb.HSet(ctx, k.data, id, v).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.rdb.ZAdd(ctx, key, redis.Z{Score: score, Member: id}).Err(); err != nil {
		t.Fatal(err)
	}
	if a != "" {
		if err := s.rdb.HSet(ctx, k.attempts, id, a).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// migrate runs Migrate and fails unless it moved want.
func migrate(t *testing.T, s *Store, want Legacy) {
	t.Helper()
	got, err := s.Migrate(context.Background(), nil)
	if err != nil || got != want {
		t.Fatalf("migrate moved %+v (%v), want %+v", got, err, want)
	}
}

// TestMigrateRetiredFormats: data of every retired format, written as
// those builds laid it out, is moved by Migrate and then delivered as
// those builds would have: a pending bare value (its due score), one
// whose old claim was in flight ("attempt:due:token", a lease score of
// whole ms), one released for a retry ("attempt:due:"), a dead one
// (replayed with its due time and attempts), and format 2's fractional
// lease scores, expired (re-leased, counted) and live (not claimed,
// cancelled as in flight, settled by nobody). Check finds nothing
// wrong after, and a second run moves nothing.
func TestMigrateRetiredFormats(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	header := func(due int64) []byte { return stampValue(valueMark, due, 0, enc("h")) }
	liveEnd := time.Now().Add(time.Hour).UnixMilli()
	gone := float64(time.Now().Add(-time.Hour).UnixMilli())
	putOld(t, s, "pending", bareValue, "due", 1000, "")
	putOld(t, s, "leased", bareValue, "inflight", gone, "1:1500:oldtoken")
	putOld(t, s, "retried", bareValue, "due", 3000, "2:2500:")
	putOld(t, s, "dead", bareValue, "dead", 9000, "10:4242:")
	putOld(t, s, "frac-gone", header(700), "inflight", gone+0.123, "1")
	putOld(t, s, "frac-live", header(800), "inflight", float64(liveEnd)+0.457, "")
	if l, err := s.Legacy(ctx); err != nil || l != (Legacy{Bare: 4, Leases: 3, Attempts: 3}) {
		t.Fatalf("Legacy: %+v, %v", l, err)
	}
	if err := s.CheckSchema(ctx); !errors.Is(err, ErrMigrate) {
		t.Fatalf("CheckSchema on retired formats: %v, want ErrMigrate", err)
	}

	migrate(t, s, Legacy{Bare: 4, Leases: 3, Attempts: 3})
	migrate(t, s, Legacy{})
	if l, err := s.Legacy(ctx); err != nil || l.Total() != 0 {
		t.Fatalf("Legacy after migrate: %+v, %v", l, err)
	}
	if f, err := s.Schema(ctx); err != nil || f != FormatIntegerLeases {
		t.Fatalf("schema key: %d, %v", f, err)
	}
	if err := s.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	mustBeConsistent(t, s)
	k := s.keys[s.Shard("frac-live")]
	if sc := s.rdb.ZScore(ctx, k.inflight, "frac-live").Val(); sc != float64(liveEnd*1000+457) {
		t.Fatalf("frac-live: lease score %v, want its token %d", sc, liveEnd*1000+457)
	}
	if e, err := s.Get(ctx, "frac-live"); err != nil || e.State != StateInflight || e.DueMs != liveEnd || e.Attempts != 1 {
		t.Fatalf("frac-live: %+v, %v", e, err)
	}

	got := claimAll(t, s, time.Minute)
	want := map[string][2]int64{"pending": {1000, 1}, "leased": {1500, 2}, "retried": {2500, 3}, "frac-gone": {700, 3}}
	if len(got) != len(want) {
		t.Fatalf("claimed %v, want %v", got, want)
	}
	for id, w := range want {
		c := got[id]
		if c.DueMs != w[0] || int64(c.Attempt) != w[1] || c.Occurrence != 0 {
			t.Errorf("%s: claimed due %d attempt %d, want due %d attempt %d", id, c.DueMs, c.Attempt, w[0], w[1])
		}
		if _, err := envelope.Decode(c.Data); err != nil {
			t.Errorf("%s: data %q does not decode: %v", id, c.Data, err)
		}
	}
	// A release keeps the due time for the next attempt; an ack deletes.
	if settle(t, s, got["pending"], Retry, 0) != 1 || settle(t, s, got["leased"], Delivered, 0) != 1 {
		t.Fatal("not settled")
	}
	if c := claimAll(t, s, time.Minute)["pending"]; c.DueMs != 1000 || c.Attempt != 2 {
		t.Fatalf("after a release: due %d attempt %d", c.DueMs, c.Attempt)
	}
	// The dead one keeps its due time and attempts through a replay.
	if n, err := s.Replay(ctx, []string{"dead"}); err != nil || n != 1 {
		t.Fatalf("replay: %d, %v", n, err)
	}
	if c := claimAll(t, s, time.Minute)["dead"]; c.DueMs != 4242 || c.Attempt != 11 || c.Base != 10 || string(c.Data) != string(bareValue) {
		t.Fatalf("after replay: %+v", c)
	}
	// The live lease: a settle by the fraction its daemon knew does
	// nothing; a cancel finds it in flight.
	if settle(t, s, Claimed{ID: "frac-live", Token: strconv.FormatFloat(float64(liveEnd)+0.457, 'f', 3, 64)}, Delivered, 0) != 0 {
		t.Fatal("a settle by the old fractional score settled")
	}
	if c, err := s.Cancel(ctx, "frac-live"); err != nil || !c.Existed || !c.InFlight {
		t.Fatalf("cancel of the live lease: %+v, %v", c, err)
	}
	mustBeConsistent(t, s)
}

// TestMigrateResumes: a migrate cut off after any step (here: after the
// values of every shard, before their attempts and leases) and run again
// ends where one run does, and writes the schema key only at its end.
func TestMigrateResumes(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	putOld(t, s, "leased", bareValue, "inflight", 2000, "3:1500:tok") // ended in 1970
	putOld(t, s, "retried", bareValue, "due", 3000, "2:2500:")
	for sh := range s.Shards() {
		if _, err := s.migrateValues(ctx, sh); err != nil {
			t.Fatal(err)
		}
	}
	if f, _ := s.Schema(ctx); f != 0 {
		t.Fatalf("schema key %d before the migrate finished", f)
	}
	migrate(t, s, Legacy{Leases: 1, Attempts: 2})
	got := claimAll(t, s, time.Minute)
	if c := got["leased"]; c.DueMs != 1500 || c.Attempt != 4 {
		t.Fatalf("leased: due %d attempt %d, want 1500 and 4", c.DueMs, c.Attempt)
	}
	if c := got["retried"]; c.DueMs != 2500 || c.Attempt != 3 {
		t.Fatalf("retried: due %d attempt %d, want 2500 and 3", c.DueMs, c.Attempt)
	}
}

// TestMigrateWaitsForOlderBuilds: a live member that announces no format,
// or an announcement of a retired one, is a daemon of a build before
// format 3 that would go on writing them: Migrate refuses, changing
// nothing, until it left.
func TestMigrateWaitsForOlderBuilds(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	putOld(t, s, "x", bareValue, "due", 1000, "")
	if _, _, err := s.Heartbeat(ctx, "old", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Migrate(ctx, nil); !errors.Is(err, ErrOlderBuildLive) {
		t.Fatalf("migrate beside an unannounced member: %v", err)
	}
	if _, err := s.AgreeFormats(ctx, "old", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.rdb.ZAdd(ctx, formatsKey("t"), redis.Z{Score: float64(time.Now().Add(time.Minute).UnixMilli()), Member: "2:two"}).Result(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Migrate(ctx, nil); !errors.Is(err, ErrOlderBuildLive) || !strings.Contains(err.Error(), "format 2") {
		t.Fatalf("migrate beside a format-2 daemon: %v", err)
	}
	if l, _ := s.Legacy(ctx); l.Bare != 1 {
		t.Fatalf("a refused migrate moved something: %+v", l)
	}
	s.rdb.ZRem(ctx, formatsKey("t"), "2:two")
	// A daemon with redis.due_buckets on (it announces format 4) may write
	// the due buckets still: migrate and a start wait for it.
	if _, err := s.rdb.ZAdd(ctx, formatsKey("t"), redis.Z{Score: float64(time.Now().Add(time.Minute).UnixMilli()), Member: "4:four"}).Result(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Migrate(ctx, nil); !errors.Is(err, ErrOlderBuildLive) || !strings.Contains(err.Error(), "format 4") {
		t.Fatalf("migrate beside a daemon writing the due buckets: %v", err)
	}
	if err := s.rdb.Set(ctx, schemaKey("t"), FormatIntegerLeases, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckSchema(ctx); !errors.Is(err, ErrOlderBuildLive) || errors.Is(err, ErrMigrate) {
		t.Fatalf("a start beside a daemon writing the due buckets: %v, want ErrOlderBuildLive (not final)", err)
	}
	s.rdb.ZRem(ctx, formatsKey("t"), "4:four")
	migrate(t, s, Legacy{Bare: 1})
}

// TestCheckSchema: a daemon's start reads the schema key; without it, an
// empty namespace, or a small one holding only format 3, gets the key; a
// small one holding a retired format, or a large one, is refused with
// ErrMigrate; a gated store runs no shard script before the check passed.
func TestCheckSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, _ := newStore(t)
	gated := New(r.rdb, "g", 4, WithSchemaGate())
	_, errs := gated.Schedule(ctx, []Item{{ID: "a", Data: enc("a")}})
	if !errors.Is(errs[0], ErrNotWritten) {
		t.Fatalf("schedule before the check: %v, want ErrNotWritten", errs[0])
	}
	if err := gated.CheckSchema(ctx); err != nil {
		t.Fatalf("an empty namespace: %v", err)
	}
	if f, _ := gated.Schema(ctx); f != FormatIntegerLeases {
		t.Fatalf("schema key %d on an empty namespace", f)
	}
	schedule(t, gated, Item{ID: "a", Data: enc("a")})

	// Format 3's data, no key (an earlier build of format 3 wrote it).
	s := New(r.rdb, "small", 4)
	for i := range 20 {
		schedule(t, s, Item{ID: fmt.Sprint(i), DelayMicros: 3600e6, Data: enc("x")})
	}
	schedule(t, s, Item{ID: "c", Absolute: true, AtMicros: 1000, Data: enc("c")})
	claimOnly(t, s, "c", time.Hour)
	if err := s.CheckSchema(ctx); err != nil {
		t.Fatalf("format 3's data: %v", err)
	}
	if f, _ := s.Schema(ctx); f != FormatIntegerLeases {
		t.Fatalf("schema key %d after a clean scan", f)
	}

	for name, put := range map[string]func(s *Store){
		"bare value":     func(s *Store) { putOld(t, s, "b", bareValue, "due", 1000, "") },
		"fractional":     func(s *Store) { putOld(t, s, "f", stampValue(valueMark, 1, 0, enc("f")), "inflight", 5000.5, "") },
		"old attempts":   func(s *Store) { putOld(t, s, "a", stampValue(valueMark, 1, 0, enc("a")), "due", 1, "1:1:") },
		"whole ms lease": func(s *Store) { putOld(t, s, "w", stampValue(valueMark, 1, 0, enc("w")), "inflight", 5000, "") },
	} {
		s := New(r.rdb, strings.ReplaceAll(name, " ", "-"), 4, WithSchemaGate())
		put(s)
		err := s.CheckSchema(ctx)
		if !errors.Is(err, ErrMigrate) || !strings.Contains(err.Error(), "delayd migrate") {
			t.Errorf("%s: %v, want ErrMigrate naming delayd migrate", name, err)
		}
		if f, _ := s.Schema(ctx); f != 0 {
			t.Errorf("%s: the refused start wrote the schema key", name)
		}
		if _, err := s.Claim(ctx, []int{0, 1, 2, 3}, ClaimOptions{Batch: 10, Lease: time.Minute}); !errors.Is(err, ErrNotWritten) {
			t.Errorf("%s: claim after a refused check: %v", name, err)
		}
	}

	// Too large to scan at start.
	big := New(r.rdb, "big", 4)
	pipe := r.rdb.Pipeline()
	v := stampValue(valueMark, 1, 0, enc("x"))
	for i := range startScanMax + 1 {
		pipe.HSet(ctx, big.keys[i%4].data, fmt.Sprint(i), v)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if err := big.CheckSchema(ctx); !errors.Is(err, ErrMigrate) || !strings.Contains(err.Error(), "10001 entries") {
		t.Fatalf("a large namespace: %v, want ErrMigrate with its count", err)
	}
	if _, err := big.Migrate(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := big.CheckSchema(ctx); err != nil {
		t.Fatalf("after migrate: %v", err)
	}
}

// TestMigrateUnderClusterAndACL: under Redis Cluster, as the ACL user of
// docs/security.md, delayd migrate needs +@transaction (WATCH, MULTI,
// EXEC), as the docs say; granted it, it moves the retired formats of
// every shard (each its own slot; the due buckets' keys too, which the
// ACL pattern covers), and a start then finds the key.
func TestMigrateUnderClusterAndACL(t *testing.T) {
	t.Parallel()
	cl := testutil.StartRedisCluster(t)
	ctx := context.Background()
	acl := func(extra ...string) {
		t.Helper()
		for _, n := range cl.Nodes {
			args := []any{"ACL", "SETUSER", "delayd", "reset", "on", ">pw", "resetkeys", "~{mc:*", "-@all", "+@read", "+@write",
				"+@scripting", "+@connection", "+time", "-@dangerous", "+info", "+script|load", "+script|exists",
				"+cluster|slots"}
			for _, e := range extra {
				args = append(args, e)
			}
			if err := n.Client().Do(ctx, args...).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	acl()
	s := New(NewClient(Options{Addrs: cl.Addrs(), Username: "delayd", Password: "pw"}), "mc", 6)
	defer s.Close()
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	gone := float64(time.Now().Add(-time.Hour).UnixMilli())
	var want Legacy
	for i := range 12 {
		id := fmt.Sprint("m", i)
		putOld(t, s, id, bareValue, "inflight", gone+0.25, "2:1500:tok")
		want.Bare, want.Leases, want.Attempts = want.Bare+1, want.Leases+1, want.Attempts+1
	}
	for i := range 6 {
		putBucketed(t, s, fmt.Sprint("mb", i), 2000, 2000)
		want.Buckets++
	}
	if err := s.CheckSchema(ctx); !errors.Is(err, ErrMigrate) {
		t.Fatalf("CheckSchema: %v, want ErrMigrate", err)
	}
	if _, err := s.Migrate(ctx, nil); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("migrate without +@transaction: %v, want NOPERM", err)
	}
	acl("+@transaction")
	migrate(t, s, want)
	if err := s.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	got := claimAll(t, s, time.Minute)
	for i := range 12 {
		if c := got[fmt.Sprint("m", i)]; c.DueMs != 1500 || c.Attempt != 3 {
			t.Fatalf("m%d: claimed %+v, want due 1500, attempt 3", i, c)
		}
	}
	for i := range 6 {
		if c := got[fmt.Sprint("mb", i)]; c.DueMs != 2000 || c.Attempt != 1 {
			t.Fatalf("mb%d: claimed %+v, want due 2000, attempt 1", i, c)
		}
	}
	mustBeConsistent(t, s)
}

// TestFirstSchemaWaitsForOlderBuilds: a start on a namespace without the
// schema key does not write it while a daemon of a build before format 3
// is live (a member that announces no format): such a build writes the
// retired formats, and the key would let every later start pass. The
// starting daemon's own member entry, not yet announced, is not one.
func TestFirstSchemaWaitsForOlderBuilds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, _ := newStore(t)
	s := New(r.rdb, "old", 4, WithMember("me"))
	if _, _, err := s.Heartbeat(ctx, "me", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckSchema(ctx); err != nil {
		t.Fatalf("only its own member, not yet announced: %v", err)
	}
	o := New(r.rdb, "old2", 4, WithMember("me"))
	if _, _, err := o.Heartbeat(ctx, "zero-one-build", time.Minute); err != nil {
		t.Fatal(err)
	}
	err := o.CheckSchema(ctx)
	if !errors.Is(err, ErrOlderBuildLive) || errors.Is(err, ErrMigrate) {
		t.Fatalf("beside a live member of an older build: %v, want ErrOlderBuildLive (not final)", err)
	}
	if f, _ := o.Schema(ctx); f != 0 {
		t.Fatalf("the schema key was written (%d) beside an older build", f)
	}
	if _, _, err := o.Heartbeat(ctx, "zero-one-build", 0); err != nil {
		t.Fatal(err)
	}
	if err := o.CheckSchema(ctx); err != nil {
		t.Fatalf("once the older build left: %v", err)
	}
}

// putBucketed writes id as the retired due buckets (format 4) laid it out,
// with redis commands: its value with the header in data, and an entry in
// the shard's bucket that starts at bound, indexed, and counted.
func putBucketed(t *testing.T, s *Store, id string, due, bound int64) {
	t.Helper()
	ctx := context.Background()
	k := s.keys[s.Shard(id)]
	b := strconv.FormatInt(bound, 10)
	for _, err := range []error{
		s.rdb.HSet(ctx, k.data, id, stampValue(valueMark, due, 0, enc("b:"+id))).Err(),
		s.rdb.ZAdd(ctx, k.pending, redis.Z{Score: float64(bound), Member: b}).Err(),
		s.rdb.ZAdd(ctx, k.pending+":"+b, redis.Z{Score: float64(due), Member: id}).Err(),
		s.rdb.IncrBy(ctx, k.pending+"#", 1).Err(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestMigrateDueBuckets: envelopes in the due buckets of the retired
// format 4 (redis.due_buckets of builds before 0.2.0) keep a start from
// going on even where the schema key says format 3 (those builds wrote
// it), are named by Legacy, and Migrate moves them to the due set at their
// due times: due ones are claimed, later ones wait, and nothing of the
// buckets is left.
func TestMigrateDueBuckets(t *testing.T) {
	t.Parallel()
	s, r := newStore(t)
	ctx := context.Background()
	later := time.Now().Add(time.Hour).UnixMilli()
	putBucketed(t, s, "b-due", 1000, 1000)
	putBucketed(t, s, "b-due2", 1500, 1000)
	putBucketed(t, s, "b-later", later, later-5)
	schedule(t, s, Item{ID: "set", Absolute: true, AtMicros: 2_000_000, Data: enc("s")})
	if err := s.rdb.Set(ctx, schemaKey(s.ns), FormatIntegerLeases, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if l, err := s.Legacy(ctx); err != nil || l != (Legacy{Buckets: 3}) {
		t.Fatalf("Legacy: %+v, %v", l, err)
	}
	if err := s.CheckSchema(ctx); !errors.Is(err, ErrMigrate) || !strings.Contains(err.Error(), "due buckets") {
		t.Fatalf("CheckSchema on due buckets: %v, want ErrMigrate naming them", err)
	}
	migrate(t, s, Legacy{Buckets: 3})
	migrate(t, s, Legacy{})
	if err := s.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if keys := r.Client().Keys(ctx, "*pending*").Val(); len(keys) != 0 {
		t.Fatalf("left of the buckets: %v", keys)
	}
	mustBeConsistent(t, s)
	got := claimAll(t, s, time.Minute)
	if len(got) != 3 || got["b-due"].DueMs != 1000 || got["b-due2"].DueMs != 1500 || got["set"].DueMs != 2000 {
		t.Fatalf("claimed %+v, want b-due, b-due2 and set at their due times", got)
	}
	if e, err := s.Get(ctx, "b-later"); err != nil || e.State != StatePending || e.DueMs != later {
		t.Fatalf("b-later: %+v, %v", e, err)
	}
}
