package store

// The model test drives the real Store against a throwaway redis-server
// with a few simulated daemons, one seeded random step at a time, and after
// every step reads the whole keyspace back to check the invariants stated
// in keys.go and to compare it with a plain Go model of the delay set.
// A failure prints the seed and the shortest failing step sequence it can
// find by re-running on an emptied Redis with steps removed.
//
// Outcomes must not depend on wall time, or a rerun would not fail the
// same way: dues are far in the past or an hour ahead, leases and retry
// delays 0 or an hour. The model still reads each claim's Redis "now", so
// it knows exactly which ids are eligible.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	modelShards = 3
	modelPool   = 30 // ids i00..i29: small, so reading every key each step is cheap
	hourMs      = int64(time.Hour / time.Millisecond)
	farMs       = int64(4102444800000) // 2100-01-01: a series starting far ahead
	bulkSize    = 5000
	bigBatch    = 4096 // a claim this big crosses Lua's unpack limit unless chunked
	keepClaims  = 16   // claims a simulated daemon remembers, to settle late
	shrinkFor   = 2 * time.Minute
	// raceSlack: a race's first lease is this much longer than an hour, and
	// its second shorter by the ms that passed (at most this), so the two
	// end in one millisecond. Few lease lengths: the lease hash keeps one
	// class per length in use.
	raceSlack = 3
)

func TestModel(t *testing.T) {
	t.Parallel()
	seeds, steps := modelPlan(t)
	for _, seed := range seeds {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			t.Parallel()
			runSeed(t, seed, steps)
		})
	}
}

// modelPlan picks the seeds and steps per seed: fresh seeds on every run,
// so CI keeps exploring; DELAYD_MODEL_SEED reruns one, DELAYD_MODEL_STEPS
// sets the steps. The long exploration (25,000 steps a seed, a minute or
// two) runs with DELAYD_SOAK=1, as .ci/run's soak step does.
func modelPlan(t *testing.T) ([]uint64, int) {
	n, steps := 4, 5_000
	switch {
	case os.Getenv("DELAYD_SOAK") == "1":
		steps = 25_000
	case testing.Short():
		n, steps = 2, 2_000
	}
	if v := os.Getenv("DELAYD_MODEL_STEPS"); v != "" {
		var err error
		if steps, err = strconv.Atoi(v); err != nil {
			t.Fatalf("DELAYD_MODEL_STEPS: %v", err)
		}
	}
	if v := os.Getenv("DELAYD_MODEL_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("DELAYD_MODEL_SEED: %v", err)
		}
		return []uint64{seed}, steps
	}
	base := uint64(time.Now().UnixNano())
	seeds := make([]uint64, n)
	for i := range seeds {
		seeds[i] = base + uint64(i)
	}
	return seeds, steps
}

func runSeed(t *testing.T, seed uint64, steps int) {
	s4, rs := newStore(t)
	// Two token hints only: equal hints are common, so a token that was
	// only as unique as its hint would be caught in a few steps.
	s := New(s4.rdb, "t", modelShards, WithTokenHint(func() int { return 1 + rand.IntN(2) }))
	rc := rs.Client()
	ctx := context.Background()
	g := newMGen(seed)
	r, err := newMRunner(ctx, s, rc, 100, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %d, %d steps, %d daemons", seed, steps, g.daemons)
	ops := make([]mOp, 0, steps)
	for i := range steps {
		o := g.next(r.m)
		ops = append(ops, o)
		if err := r.step(i, o); err != nil {
			t.Errorf("seed %d: step %d (%v): %v", seed, i, o, err)
			t.Fatal(failureReport(seed, ops, rerun(t, ctx, s, rc)))
		}
	}
	t.Logf("seed %d covered %v", seed, r.seen)
}

// rerun returns a function that runs ops on an emptied Redis, with a full
// Check after every step (short sequences can afford it, and it finds a
// broken invariant at the step that broke it), and returns the index of
// the failing step and why, or -1, and the trace when tracing.
func rerun(t *testing.T, ctx context.Context, s *Store, rc *redis.Client) func([]mOp, bool) (int, []string, error) {
	return func(ops []mOp, tracing bool) (int, []string, error) {
		// Flushed first: the runner reads the empty keyspace as "before".
		err := rc.FlushAll(ctx).Err()
		var r *mRunner
		if err == nil {
			r, err = newMRunner(ctx, s, rc, 1, tracing)
		}
		if err != nil {
			t.Logf("rerun: %v", err)
			return -1, nil, nil
		}
		for i, o := range ops {
			if err := r.step(i, o); err != nil {
				return i, r.trace, err
			}
		}
		return -1, r.trace, nil
	}
}

// failureReport shrinks the failing ops and describes the shortest
// sequence found, with the trace of its run.
func failureReport(seed uint64, ops []mOp, replay func([]mOp, bool) (int, []string, error)) string {
	short := shrink(ops, func(ops []mOp) (int, error) {
		i, _, err := replay(ops, false)
		return i, err
	}, time.Now().Add(shrinkFor))
	i, trace, err := replay(short, true)
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: shortest failing sequence found, %d of %d steps "+
		"(rerun: DELAYD_MODEL_SEED=%d go test -race -run TestModel ./internal/store):\n", seed, len(short), len(ops), seed)
	for k, o := range short {
		fmt.Fprintf(&b, "%5d  %v\n", k, o)
	}
	if err == nil {
		b.WriteString("but it did not fail again on a fresh Redis\n")
		return b.String()
	}
	b.WriteString("its run:\n")
	for _, l := range trace {
		fmt.Fprintf(&b, "       %s\n", l)
	}
	fmt.Fprintf(&b, "fails at step %d: %v", i, err)
	return b.String()
}

// shrink removes steps while the sequence still fails (any failure counts):
// chunks of half the steps, then ever smaller ones, down to single steps
// until none can go. A failing try is cut after its failing step.
func shrink(ops []mOp, fails func([]mOp) (int, error), deadline time.Time) []mOp {
	i, err := fails(ops)
	if err == nil {
		return ops // did not fail again: keep it all
	}
	ops = ops[:i+1]
	for chunk := max(len(ops)/2, 1); time.Now().Before(deadline); {
		changed := false
		for start := 0; start < len(ops) && time.Now().Before(deadline); {
			cand := slices.Concat(ops[:start], ops[min(start+chunk, len(ops)):])
			if i, err := fails(cand); err != nil {
				ops, changed = cand[:i+1], true
			} else {
				start += chunk
			}
		}
		if chunk == 1 && !changed {
			break
		}
		chunk = max(chunk/2, 1)
	}
	// Then the items and ids inside the steps that remain.
	for i := 0; i < len(ops) && time.Now().Before(deadline); i++ {
		for j := 0; j < ops[i].parts() && ops[i].parts() > 1; {
			cand := slices.Clone(ops)
			cand[i] = ops[i].without(j)
			if k, err := fails(cand); err != nil && k >= i {
				ops = cand[:k+1]
			} else {
				j++
			}
		}
	}
	return ops
}

// parts is how many items or ids o has that the shrinker may drop, one
// by one, while at least one stays.
func (o mOp) parts() int {
	switch o.kind {
	case opSchedule:
		return len(o.items)
	case opReplay, opPurge:
		return len(o.ids)
	}
	return 0
}

// without returns o without its j-th item or id.
func (o mOp) without(j int) mOp {
	if o.kind == opSchedule {
		o.items = slices.Delete(slices.Clone(o.items), j, j+1)
	} else {
		o.ids = slices.Delete(slices.Clone(o.ids), j, j+1)
	}
	return o
}

// The steps.

type mOpKind byte

const (
	opSchedule mOpKind = iota
	opBulk
	opCancel
	opClaim
	opSettle
	opAckIDs // settle ids with whatever claim the model knows: only inside a fault
	opReplay
	opPurge
	opFlush
	opFault
	opRace // replace an id while its old claim is unsettled, in one millisecond
	opResume
)

// mOp is one step. It names what to do, never a value that only a run
// produces (a claim token): a settle names a daemon's n-th latest claim, so
// the step still means something after the shrinker removed others.
type mOp struct {
	kind    mOpKind
	items   []mItem  // schedule
	ids     []string // cancel (one), replay, purge, ack ids
	daemon  int      // claim, settle
	back    int      // settle: the daemon's claim before its latest
	batch   int      // claim
	lease   int64    // claim, ms
	bytes   int64    // claim: the byte budget, 0 for none
	shards  []int    // claim: nil is every shard
	seed    uint64   // settle: picks the items, their outcomes and errors
	all     bool     // settle: every item delivered
	retry   int64    // settle, ms
	outcome Outcome  // ack ids
	other   int      // race: the daemon that claims the new version
	shard   int      // bulk, fault
	key     int      // fault: position of the key in shardKeys.list
	seq     int      // bulk: names its ids
	inner   *mOp     // fault: the step that must fail
}

type mItem struct {
	id, data string
	later    bool // due in an hour, else far in the past
	series   bool // a recurring series (its first occurrence)
}

func (o mOp) String() string {
	switch o.kind {
	case opSchedule:
		parts := make([]string, len(o.items))
		for i, it := range o.items {
			when := "past"
			if it.later {
				when = "+1h"
			}
			if it.series {
				when += " series"
			}
			parts[i] = it.data + "@" + when
		}
		return "schedule " + strings.Join(parts, " ")
	case opBulk:
		return fmt.Sprintf("bulk schedule of %d due ids b%d.* into shard %d", bulkSize, o.seq, o.shard)
	case opCancel:
		return "cancel " + o.ids[0]
	case opClaim:
		on := "all shards"
		if o.shards != nil {
			on = fmt.Sprintf("shards %v", o.shards)
		}
		return fmt.Sprintf("claim by d%d of %s, batch %d, lease %dms, %d bytes", o.daemon, on, o.batch, o.lease, o.bytes)
	case opSettle:
		how := fmt.Sprintf("some items (seed %#x)", o.seed)
		if o.all {
			how = "every item delivered"
		}
		return fmt.Sprintf("settle by d%d of its claim %d back from the latest (wrapping): %s, retry %dms", o.daemon, o.back, how, o.retry)
	case opAckIDs:
		return fmt.Sprintf("settle %v with their current tokens: %c", o.ids, o.outcome)
	case opReplay:
		return fmt.Sprintf("replay %v", o.ids)
	case opPurge:
		return fmt.Sprintf("purge %v", o.ids)
	case opFlush:
		return "SCRIPT FLUSH and FUNCTION FLUSH"
	case opFault:
		return fmt.Sprintf("fault: shard %d key %s is a string during: %v", o.shard, mKeyNames[o.key], *o.inner)
	case opResume:
		return "resume " + mPattern + ": its parked envelopes back to their due times"
	case opRace:
		return fmt.Sprintf("race: schedule %s@past, claim by d%d (lease %dms), replace with %s@past, claim by d%d "+
			"ending in the same ms, d%d acks its stale claim", o.items[0].data, o.daemon, o.lease+raceSlack, o.items[1].data, o.other, o.daemon)
	}
	return fmt.Sprintf("op %d", o.kind)
}

// mKeyNames are the names of shardKeys.list's keys a fault may hit.
var mKeyNames = []string{"due", "inflight", "data", "attempts", "dead", "errors", "lease", "seen", "done"}

// mGen draws the steps of one seed.
type mGen struct {
	rng     *rand.Rand
	daemons int
	seq     int
	pool    []string
	byShard [][]string
}

func newMGen(seed uint64) *mGen {
	g := &mGen{rng: rand.New(rand.NewPCG(seed, 0x6d6f64656c)), byShard: make([][]string, modelShards)}
	g.daemons = 2 + g.rng.IntN(2)
	for i := range modelPool {
		id := fmt.Sprintf("i%02d", i)
		g.pool = append(g.pool, id)
		sh := ShardOf(id, modelShards)
		g.byShard[sh] = append(g.byShard[sh], id)
	}
	return g
}

func (g *mGen) next(m *mModel) mOp {
	if len(m.ids) > 200 && g.rng.IntN(5) > 0 {
		return g.drain(m)
	}
	if g.rng.IntN(4000) == 0 {
		g.seq++
		return mOp{kind: opBulk, shard: g.rng.IntN(modelShards), seq: g.seq}
	}
	switch w := g.rng.IntN(100); {
	case w < 25:
		return g.schedule(g.pool, 1+g.rng.IntN(5))
	case w < 50:
		lease := int64(0)
		if g.rng.IntN(2) == 0 {
			lease = hourMs
		}
		o := mOp{kind: opClaim, daemon: g.rng.IntN(g.daemons), batch: 1 + g.rng.IntN(8), lease: lease}
		if g.rng.IntN(4) == 0 {
			o.bytes = 1 + g.rng.Int64N(150) // values are 14 to 25 bytes: a few per shard
		}
		return o
	case w < 75:
		back := g.rng.IntN(3)
		if g.rng.IntN(5) == 0 {
			back = g.rng.IntN(keepClaims) // likely stale by now
		}
		retry := int64(0)
		if g.rng.IntN(4) == 0 {
			retry = hourMs
		}
		return mOp{kind: opSettle, daemon: g.rng.IntN(g.daemons), back: back, seed: g.rng.Uint64(), retry: retry}
	case w < 83:
		return mOp{kind: opCancel, ids: g.pick(g.pool, 1)}
	case w < 89:
		return mOp{kind: opReplay, ids: g.pick(g.pool, 1+g.rng.IntN(3))}
	case w < 94:
		return mOp{kind: opPurge, ids: g.pick(g.pool, 1+g.rng.IntN(3))}
	case w < 95:
		return mOp{kind: opFlush}
	case w < 96:
		return mOp{kind: opResume}
	case w < 98:
		return g.race()
	default:
		return g.fault()
	}
}

// drain works off a bulk: daemon 0 claims big batches with a lease that
// expires at once (so nothing can stay stuck) and delivers them.
func (g *mGen) drain(m *mModel) mOp {
	if cl := m.daemons[0]; len(cl) > 0 {
		current := 0
		for _, c := range cl[len(cl)-1] {
			if e := m.ids[c.ID]; e != nil && e.token == c.Token {
				current++
			}
		}
		if current > 100 {
			return mOp{kind: opSettle, all: true}
		}
	}
	return mOp{kind: opClaim, batch: bigBatch}
}

func (g *mGen) schedule(from []string, n int) mOp {
	o := mOp{kind: opSchedule}
	for range n {
		id := from[g.rng.IntN(len(from))]
		g.seq++
		later := g.rng.IntN(2) == 0
		o.items = append(o.items, mItem{id: id, data: id + "#" + strconv.Itoa(g.seq), later: later,
			series: g.rng.IntN(3) == 0})
	}
	return o
}

// race draws an opRace on an id of the pool.
func (g *mGen) race() mOp {
	id := g.pool[g.rng.IntN(len(g.pool))]
	o := mOp{kind: opRace, daemon: g.rng.IntN(g.daemons), other: g.rng.IntN(g.daemons), lease: hourMs}
	for range 2 {
		g.seq++
		o.items = append(o.items, mItem{id: id, data: id + "#" + strconv.Itoa(g.seq)})
	}
	return o
}

// pick returns n distinct ids of from.
func (g *mGen) pick(from []string, n int) []string {
	p := g.rng.Perm(len(from))[:min(n, len(from))]
	out := make([]string, len(p))
	for i, j := range p {
		out[i] = from[j]
	}
	return out
}

// fault is a step run while one of a shard's keys holds a string: the step
// must fail and change nothing, unless it does not touch the key.
func (g *mGen) fault() mOp {
	sh := g.rng.IntN(modelShards)
	ids := g.byShard[sh]
	var inner mOp
	switch g.rng.IntN(6) {
	case 0:
		inner = g.schedule(ids, 1+g.rng.IntN(2))
	case 1:
		inner = mOp{kind: opCancel, ids: g.pick(ids, 1)}
	case 2:
		inner = mOp{kind: opClaim, shards: []int{sh}, batch: 8}
	case 3:
		inner = mOp{kind: opAckIDs, ids: g.pick(ids, 2), outcome: mOutcomes[g.rng.IntN(len(mOutcomes))]}
	case 4:
		inner = mOp{kind: opReplay, ids: g.pick(ids, 2)}
	default:
		inner = mOp{kind: opPurge, ids: g.pick(ids, 2)}
	}
	return mOp{kind: opFault, shard: sh, key: g.rng.IntN(len(mKeyNames)), inner: &inner}
}

var mOutcomes = []Outcome{Delivered, Retry, Postpone, Bury, Next, Hold}

// bulkIDs names n ids of shard sh for bulk seq.
func bulkIDs(seq, sh, n int) []string {
	out := make([]string, 0, n)
	for i := 0; len(out) < n; i++ {
		if id := "b" + strconv.Itoa(seq) + "." + strconv.Itoa(i); ShardOf(id, modelShards) == sh {
			out = append(out, id)
		}
	}
	return out
}
