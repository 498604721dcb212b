package store

// The model test drives the real Store against a throwaway redis-server
// with a few simulated daemons, one seeded random step at a time, and after
// every step reads the whole keyspace back to check the invariants stated
// in scripts.go and to compare it with a plain Go model of the delay set.
// A failure prints the seed and the shortest failing step sequence it can
// find by re-running on an emptied Redis with steps removed.
//
// Outcomes must not depend on wall time, or a rerun would not fail the
// same way: dues are far in the past or an hour ahead, leases and retry
// delays 0 or an hour. The model still reads each claim's Redis "now", so
// it knows exactly which ids are eligible.

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"sort"
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
	bulkSize    = 5000
	bigBatch    = 4096 // a claim this big crosses Lua's unpack limit unless chunked
	keepClaims  = 16   // claims a simulated daemon remembers, to settle late
	shrinkFor   = 2 * time.Minute
)

func TestModel(t *testing.T) {
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
// sets the steps.
func modelPlan(t *testing.T) ([]uint64, int) {
	n, steps := 4, 25_000
	if testing.Short() {
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
	s := New(s4.rdb, "t", modelShards)
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
func rerun(t *testing.T, ctx context.Context, s *Store, rc *redis.Client) func([]mOp, bool) (int, error, []string) {
	return func(ops []mOp, tracing bool) (int, error, []string) {
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
				return i, err, r.trace
			}
		}
		return -1, nil, r.trace
	}
}

// failureReport shrinks the failing ops and describes the shortest
// sequence found, with the trace of its run.
func failureReport(seed uint64, ops []mOp, replay func([]mOp, bool) (int, error, []string)) string {
	short := shrink(ops, func(ops []mOp) (int, error) {
		i, err, _ := replay(ops, false)
		return i, err
	}, time.Now().Add(shrinkFor))
	i, err, trace := replay(short, true)
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
	shards  []int    // claim: nil is every shard
	seed    uint64   // settle: picks the items, their outcomes and errors
	all     bool     // settle: every item delivered
	retry   int64    // settle, ms
	outcome Outcome  // ack ids
	shard   int      // bulk, fault
	key     int      // fault: position of the key in shardKeys.list
	seq     int      // bulk: names its ids
	inner   *mOp     // fault: the step that must fail
}

type mItem struct {
	id, data string
	later    bool // due in an hour, else far in the past
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
		return fmt.Sprintf("claim by d%d of %s, batch %d, lease %dms", o.daemon, on, o.batch, o.lease)
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
		return "SCRIPT FLUSH"
	case opFault:
		return fmt.Sprintf("fault: shard %d key %s is a string during: %v", o.shard, mKeyNames[o.key], *o.inner)
	}
	return fmt.Sprintf("op %d", o.kind)
}

var mKeyNames = []string{"due", "inflight", "data", "claims", "dead", "errors"}

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
		return mOp{kind: opClaim, daemon: g.rng.IntN(g.daemons), batch: 1 + g.rng.IntN(8), lease: lease}
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
	case w < 96:
		return mOp{kind: opFlush}
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
		o.items = append(o.items, mItem{id: id, data: id + "#" + strconv.Itoa(g.seq), later: g.rng.IntN(2) == 0})
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
// must fail and change nothing.
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

var mOutcomes = []Outcome{Delivered, Retry, Postpone, Bury}

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

// The model.

type mPlace byte

const (
	mDue      mPlace = 'p'
	mInflight mPlace = 'i'
	mDead     mPlace = 'x'
)

func (p mPlace) String() string {
	return map[mPlace]string{mDue: "due", mInflight: "inflight", mDead: "dead"}[p]
}

// mEntry is the model of one stored id: where it is, its score there, and
// its claims and errors entries.
type mEntry struct {
	shard int
	data  string
	at    mPlace
	// score is the due time, lease expiry or time of death, ms. Where a
	// script sets it from Redis' clock and does not return it (a release, a
	// death, a replay), exact is false: the score must lie in [lo, hi], and
	// the next read of Redis fixes it.
	score, lo, hi int64
	exact         bool
	claimed       bool // a claims entry "attempt:due:token" exists
	attempt       int
	due           int64
	token         string // "" once settled
	err           string // the errors entry, "" if none
}

// mModel is the delay set as plain Go: every stored id, and what each
// simulated daemon has claimed.
type mModel struct {
	ids     map[string]*mEntry
	daemons [][][]Claimed // per daemon its latest claims, oldest first
}

// mEffects are what the model allows one step to do, for the invariant
// checks that compare the keyspace before and after it.
type mEffects struct {
	deleted  map[string]bool // by a matching ack, a cancel or a purge
	reset    map[string]bool // attempts start over: a replace, a replay
	giveBack map[string]bool // a postpone gives one attempt back
}

// put stores a new version of id, as a schedule does.
func (m *mModel) put(id, data string, due int64, fx mEffects) {
	if m.ids[id] != nil {
		fx.reset[id] = true // a replace forgets the old claim
	}
	m.ids[id] = &mEntry{shard: ShardOf(id, modelShards), data: data, at: mDue, score: due, exact: true}
}

func (m *mModel) remove(id string, fx mEffects) {
	delete(m.ids, id)
	fx.deleted[id] = true
}

// claimable is what a claim of shard at now must hand out, in order: ids
// whose lease expired, then due ids, each by score, then id, up to batch.
func (m *mModel) claimable(shard int, now int64, batch int) ([]string, error) {
	var exp, due []string
	for id, e := range m.ids {
		if e.shard != shard {
			continue
		}
		if !e.exact {
			return nil, fmt.Errorf("model: score of %q not known", id)
		}
		if e.score > now {
			continue
		}
		switch e.at {
		case mInflight:
			exp = append(exp, id)
		case mDue:
			due = append(due, id)
		}
	}
	order := func(ids []string) {
		sort.Slice(ids, func(i, j int) bool {
			a, b := m.ids[ids[i]], m.ids[ids[j]]
			if a.score != b.score {
				return a.score < b.score
			}
			return ids[i] < ids[j] // ZSET order: bytewise
		})
	}
	order(exp)
	order(due)
	exp = exp[:min(len(exp), batch)]
	return append(exp, due[:min(len(due), batch-len(exp))]...), nil
}

// next returns the lowest score at p in shard, or -1.
func (m *mModel) next(shard int, p mPlace) int64 {
	low := int64(-1)
	for _, e := range m.ids {
		if e.shard == shard && e.at == p && (low < 0 || e.score < low) {
			low = e.score
		}
	}
	return low
}

// The runner.

type mRunner struct {
	ctx        context.Context
	s          *Store
	rc         *redis.Client
	m          *mModel
	prev       []mShard
	fx         mEffects
	now        int64 // the latest Redis time seen, ms: a lower bound for what follows
	checkEvery int   // steps between full Checks: they cost 18 script calls
	tracing    bool
	trace      []string
	// seen tallies what the steps did, to show in the log what a seed
	// covered (claims that took expired leases, stale settles, ...).
	seen map[string]int
}

func newMRunner(ctx context.Context, s *Store, rc *redis.Client, checkEvery int, tracing bool) (*mRunner, error) {
	r := &mRunner{ctx: ctx, s: s, rc: rc, checkEvery: checkEvery, tracing: tracing, seen: map[string]int{},
		m: &mModel{ids: map[string]*mEntry{}, daemons: make([][][]Claimed, 3)}}
	var err error
	r.prev, _, err = readKeyspace(ctx, rc, s)
	return r, err
}

func (r *mRunner) tracef(format string, a ...any) {
	if r.tracing {
		r.trace = append(r.trace, fmt.Sprintf(format, a...))
	}
}

// step runs o, then checks the whole keyspace against the invariants and
// the model.
func (r *mRunner) step(i int, o mOp) error {
	r.fx = mEffects{deleted: map[string]bool{}, reset: map[string]bool{}, giveBack: map[string]bool{}}
	if r.tracing {
		r.tracef("%d: %v", i, o)
	}
	if err := r.apply(o); err != nil {
		return err
	}
	cur, keys, err := readKeyspace(r.ctx, r.rc, r.s)
	if err != nil {
		return err
	}
	if err := checkInvariants(r.prev, cur, r.fx); err != nil {
		return fmt.Errorf("invariant broken: %w", err)
	}
	if err := r.m.compare(cur, keys, r.s); err != nil {
		return fmt.Errorf("Redis differs from the model: %w", err)
	}
	r.prev = cur
	if (i+1)%r.checkEvery == 0 {
		for sh := range r.s.Shards() {
			found, err := r.s.Check(r.ctx, sh, CheckOptions{})
			if err != nil {
				return err
			}
			if len(found) > 0 {
				return fmt.Errorf("Check of shard %d found %v", sh, found)
			}
		}
	}
	return nil
}

func (r *mRunner) apply(o mOp) error {
	switch o.kind {
	case opSchedule:
		return r.schedule(o.items)
	case opBulk:
		r.seen["bulk"]++
		ids := bulkIDs(o.seq, o.shard, bulkSize)
		items := make([]mItem, len(ids))
		for i, id := range ids {
			items[i] = mItem{id: id, data: id}
		}
		return r.schedule(items)
	case opCancel:
		return r.cancel(o.ids[0])
	case opClaim:
		return r.claim(o)
	case opSettle:
		return r.settle(o)
	case opReplay:
		return r.replay(o.ids)
	case opPurge:
		return r.purge(o.ids)
	case opFlush:
		return r.rc.ScriptFlush(r.ctx).Err()
	case opFault:
		return r.fault(o)
	}
	return fmt.Errorf("op %v cannot run alone", o)
}

func storeItems(items []mItem) []Item {
	out := make([]Item, len(items))
	for i, it := range items {
		out[i] = Item{ID: it.id, Data: []byte(it.data), Absolute: true, AtMicros: 1000}
		if it.later {
			out[i] = Item{ID: it.id, Data: []byte(it.data), DelayMicros: hourMs * 1000}
		}
	}
	return out
}

func (r *mRunner) schedule(items []mItem) error {
	due, errs := r.s.Schedule(r.ctx, storeItems(items))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for i, it := range items {
		// AtMicros 1000 is due at 1 ms; an hour from now is after
		// everything seen so far plus an hour.
		if !it.later && due[i] != 1 || it.later && due[i] < r.now+hourMs {
			return fmt.Errorf("schedule %v: due %d (latest Redis time seen %d)", it, due[i], r.now)
		}
		if r.m.ids[it.id] != nil {
			r.seen["replaced "+r.m.ids[it.id].at.String()]++
		}
		r.m.put(it.id, it.data, due[i], r.fx)
	}
	r.tracef("   due %v", due[:min(len(due), 5)])
	return nil
}

func (r *mRunner) cancel(id string) error {
	got, err := r.s.Cancel(r.ctx, id)
	if err != nil {
		return err
	}
	var want Cancelled
	if e := r.m.ids[id]; e != nil {
		r.seen["cancelled "+e.at.String()]++
		// In flight: claimed now, or an earlier attempt was counted (its
		// publish may have gone out unconfirmed).
		want = Cancelled{Existed: true, InFlight: e.at == mInflight || (e.claimed && e.attempt > 0)}
		r.m.remove(id, r.fx)
	}
	if got != want {
		return fmt.Errorf("cancel %s: got %+v, want %+v", id, got, want)
	}
	return nil
}

// claim checks every shard's claim item by item against the model, given
// the Redis time the claim ran at.
func (r *mRunner) claim(o mOp) error {
	shards := o.shards
	if shards == nil {
		shards = []int{0, 1, 2}
	}
	res, err := r.s.Claim(r.ctx, shards, ClaimOptions{Batch: o.batch, Lease: time.Duration(o.lease) * time.Millisecond})
	if err != nil {
		return err
	}
	if len(res) != len(shards) {
		return fmt.Errorf("claim: %d results for %d shards", len(res), len(shards))
	}
	var got []Claimed
	for i, cr := range res {
		now := cr.NowMs()
		r.now = max(r.now, now)
		want, err := r.m.claimable(shards[i], now, o.batch)
		if err != nil {
			return err
		}
		if cr.Shard != shards[i] || cr.Missing != 0 || len(cr.Items) != len(want) {
			return fmt.Errorf("claim of shard %d at %d: got %d items %v (missing %d), want %v",
				shards[i], now, len(cr.Items), claimedIDs(cr.Items), cr.Missing, want)
		}
		expired := 0
		for j, c := range cr.Items {
			e := r.m.ids[want[j]]
			attempt, due := 1, e.score
			if e.claimed {
				attempt, due = e.attempt+1, e.due
			}
			if c.ID != want[j] || c.Attempt != attempt || c.DueMs != due || string(c.Data) != e.data || c.Token == "" || c.Token != cr.Items[0].Token {
				return fmt.Errorf("claim of shard %d at %d: item %d is %s attempt %d due %d data %q token %q, want %s attempt %d due %d data %q",
					shards[i], now, j, c.ID, c.Attempt, c.DueMs, c.Data, c.Token, want[j], attempt, due, e.data)
			}
			if e.at == mInflight {
				expired++
				r.seen["expired lease re-claimed"]++
			} else if e.claimed {
				r.seen["retried id re-claimed"]++
			} else {
				r.seen["claimed"]++
			}
			*e = mEntry{shard: e.shard, data: e.data, at: mInflight, score: now + o.lease, exact: true,
				claimed: true, attempt: attempt, due: due, token: c.Token, err: e.err}
		}
		if cr.Expired != expired {
			return fmt.Errorf("claim of shard %d: %d expired leases re-claimed, want %d", shards[i], cr.Expired, expired)
		}
		if nd, nl := r.m.next(shards[i], mDue), r.m.next(shards[i], mInflight); cr.NextDueMs != nd || cr.NextLeaseMs != nl {
			return fmt.Errorf("claim of shard %d: next due %d, next lease %d, want %d, %d", shards[i], cr.NextDueMs, cr.NextLeaseMs, nd, nl)
		}
		r.seen["largest shard claim"] = max(r.seen["largest shard claim"], len(cr.Items))
		if r.tracing {
			r.tracef("   shard %d at %d ms: %s", shards[i], now, describeClaims(cr.Items))
		}
		got = append(got, cr.Items...)
	}
	if len(got) > 0 {
		d := &r.m.daemons[o.daemon]
		*d = append(*d, got)
		if len(*d) > keepClaims {
			*d = (*d)[1:]
		}
	}
	return nil
}

func claimedIDs(cs []Claimed) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.ID
	}
	return out
}

func describeClaims(cs []Claimed) string {
	parts := make([]string, 0, min(len(cs), 8))
	for _, c := range cs[:min(len(cs), 8)] {
		parts = append(parts, fmt.Sprintf("%s(attempt %d, token %s)", c.ID, c.Attempt, c.Token))
	}
	if len(cs) > 8 {
		parts = append(parts, fmt.Sprintf("and %d more", len(cs)-8))
	}
	return "claimed [" + strings.Join(parts, " ") + "]"
}

// settle settles items of one of a daemon's claims, perhaps stale: only
// those whose token is still the id's claim may settle.
func (r *mRunner) settle(o mOp) error {
	cl := r.m.daemons[o.daemon]
	if len(cl) == 0 {
		r.tracef("   no claim to settle")
		return nil
	}
	c := cl[len(cl)-1-o.back%len(cl)]
	rng := rand.New(rand.NewPCG(o.seed, 1))
	whole := o.all || rng.IntN(3) == 0
	var sts []Settle
	for _, it := range c {
		if !whole && rng.IntN(2) == 0 {
			continue
		}
		st := Settle{ID: it.ID, Token: it.Token, Outcome: Delivered}
		if !o.all {
			st.Outcome = mOutcomes[rng.IntN(len(mOutcomes))]
			if rng.IntN(2) == 0 {
				st.Error = "e" + strconv.Itoa(rng.IntN(100))
			}
		}
		sts = append(sts, st)
	}
	if len(sts) == 0 {
		sts = append(sts, Settle{ID: c[0].ID, Token: c[0].Token, Outcome: Retry})
	}
	return r.ack(sts, o.retry)
}

// ack sends sts in one Ack and checks how many settled: exactly those whose
// token is the id's current claim.
func (r *mRunner) ack(sts []Settle, retry int64) error {
	byShard := map[int][]Settle{}
	want := 0
	for _, st := range sts {
		byShard[r.s.Shard(st.ID)] = append(byShard[r.s.Shard(st.ID)], st)
		if e := r.m.ids[st.ID]; e != nil && e.token != "" && e.token == st.Token {
			want++
		}
	}
	lo := r.now
	n, now, err := r.s.Ack(r.ctx, byShard, time.Duration(retry)*time.Millisecond)
	if err != nil {
		return err
	}
	r.now = max(r.now, now)
	var desc []string
	for _, st := range sts {
		e := r.m.ids[st.ID]
		match := e != nil && e.token != "" && e.token == st.Token
		if r.tracing && len(desc) < 8 {
			desc = append(desc, fmt.Sprintf("%s %c %q token %s matches %v", st.ID, st.Outcome, st.Error, st.Token, match))
		}
		if !match {
			r.seen["stale settle"]++
			continue
		}
		r.seen["settled "+string(st.Outcome)]++
		if st.Outcome == Delivered {
			r.m.remove(st.ID, r.fx)
			continue
		}
		if st.Error != "" {
			e.err = st.Error
		}
		e.token, e.exact, e.lo, e.hi = "", false, lo, now
		switch st.Outcome {
		case Bury:
			e.at = mDead
		case Postpone:
			e.attempt = max(e.attempt-1, 0)
			r.fx.giveBack[st.ID] = true
			fallthrough
		default:
			e.at, e.lo, e.hi = mDue, lo+retry, now+retry
		}
	}
	r.tracef("   %s: settled %d", strings.Join(desc, ", "), n)
	if n != want {
		return fmt.Errorf("ack settled %d, want %d", n, want)
	}
	return nil
}

func (r *mRunner) replay(ids []string) error {
	lo := r.now
	n, err := r.s.Replay(r.ctx, ids)
	if err != nil {
		return err
	}
	t, err := r.rc.Time(r.ctx).Result()
	if err != nil {
		return err
	}
	hi := t.UnixMilli()
	r.now = max(r.now, hi)
	want := 0
	for _, id := range ids {
		if e := r.m.ids[id]; e != nil && e.at == mDead {
			want++
			*e = mEntry{shard: e.shard, data: e.data, at: mDue, lo: lo, hi: hi}
			r.fx.reset[id] = true
		}
	}
	r.seen["replayed"] += n
	if n != want {
		return fmt.Errorf("replay %v: %d were dead, want %d", ids, n, want)
	}
	return nil
}

func (r *mRunner) purge(ids []string) error {
	n, err := r.s.Purge(r.ctx, ids)
	if err != nil {
		return err
	}
	want := 0
	for _, id := range ids {
		if e := r.m.ids[id]; e != nil && e.at == mDead {
			want++
			r.m.remove(id, r.fx)
		}
	}
	r.seen["purged"] += n
	if n != want {
		return fmt.Errorf("purge %v: purged %d, want %d", ids, n, want)
	}
	return nil
}

// fault puts a string where one of a shard's keys was, runs a step that
// must fail on it, and checks that the step changed nothing: Redis does not
// roll back a script that stops part-way.
func (r *mRunner) fault(o mOp) error {
	k := r.s.keys[o.shard].list()[o.key]
	moved := k + ":moved" // same hash tag
	had, err := r.rc.Exists(r.ctx, k).Result()
	if err != nil {
		return err
	}
	if had == 1 {
		if err := r.rc.Rename(r.ctx, k, moved).Err(); err != nil {
			return err
		}
	}
	if err := r.rc.Set(r.ctx, k, "not a "+mKeyNames[o.key], 0).Err(); err != nil {
		return err
	}
	ferr := r.failing(*o.inner)
	r.tracef("   failed with: %v", ferr)
	if err := r.rc.Del(r.ctx, k).Err(); err != nil {
		return err
	}
	if had == 1 {
		if err := r.rc.Rename(r.ctx, moved, k).Err(); err != nil {
			return err
		}
	}
	r.seen["fault"]++
	if ferr == nil {
		return errors.New("the step succeeded on a key of the wrong type")
	}
	cur, _, err := readKeyspace(r.ctx, r.rc, r.s)
	if err != nil {
		return err
	}
	if !reflect.DeepEqual(cur, r.prev) {
		return fmt.Errorf("the failed step changed shard keys:\nbefore %+v\nafter  %+v", r.prev, cur)
	}
	return nil
}

// failing runs o's store call only, and returns its error. Schedule and
// cancel must say that nothing was written.
func (r *mRunner) failing(o mOp) error {
	switch o.kind {
	case opSchedule:
		_, errs := r.s.Schedule(r.ctx, storeItems(o.items))
		err := errors.Join(errs...)
		if err != nil && !errors.Is(err, ErrNotWritten) {
			return fmt.Errorf("schedule refused, but not as not written: %w", err)
		}
		return err
	case opCancel:
		_, err := r.s.Cancel(r.ctx, o.ids[0])
		if err != nil && !errors.Is(err, ErrNotWritten) {
			return fmt.Errorf("cancel refused, but not as not written: %w", err)
		}
		return err
	case opClaim:
		res, err := r.s.Claim(r.ctx, o.shards, ClaimOptions{Batch: o.batch, Lease: time.Duration(o.lease) * time.Millisecond})
		if len(res) > 0 {
			return nil // reported as success: the caller fails the step
		}
		return err
	case opAckIDs:
		var sts []Settle
		for _, id := range o.ids {
			tok := "none"
			if e := r.m.ids[id]; e != nil && e.token != "" {
				tok = e.token
			}
			sts = append(sts, Settle{ID: id, Token: tok, Outcome: o.outcome, Error: "x"})
		}
		_, _, err := r.s.Ack(r.ctx, map[int][]Settle{r.s.Shard(o.ids[0]): sts}, 0)
		return err
	case opReplay:
		_, err := r.s.Replay(r.ctx, o.ids)
		return err
	case opPurge:
		_, err := r.s.Purge(r.ctx, o.ids)
		return err
	}
	return fmt.Errorf("op %v cannot run in a fault", o)
}

// Reading Redis back.

// mShard is one shard's keys as read directly from Redis.
type mShard struct {
	due, inflight, dead map[string]int64
	data, claims, errs  map[string]string
}

// readKeyspace reads every shard's keys and the names of all keys, in one
// round trip.
func readKeyspace(ctx context.Context, rc *redis.Client, s *Store) ([]mShard, []string, error) {
	pipe := rc.Pipeline()
	zs := make([][3]*redis.ZSliceCmd, s.shards)
	hs := make([][3]*redis.MapStringStringCmd, s.shards)
	for sh := range s.shards {
		k := s.keys[sh]
		zs[sh] = [3]*redis.ZSliceCmd{pipe.ZRangeWithScores(ctx, k.due, 0, -1),
			pipe.ZRangeWithScores(ctx, k.inflight, 0, -1), pipe.ZRangeWithScores(ctx, k.dead, 0, -1)}
		hs[sh] = [3]*redis.MapStringStringCmd{pipe.HGetAll(ctx, k.data), pipe.HGetAll(ctx, k.attempts), pipe.HGetAll(ctx, k.errors)}
	}
	keys := pipe.Keys(ctx, "*")
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, nil, fmt.Errorf("read keyspace: %w", err)
	}
	out := make([]mShard, s.shards)
	for sh := range out {
		var z [3]map[string]int64
		for i, c := range zs[sh] {
			z[i] = make(map[string]int64, len(c.Val()))
			for _, m := range c.Val() {
				z[i][m.Member.(string)] = int64(m.Score)
			}
		}
		out[sh] = mShard{due: z[0], inflight: z[1], dead: z[2], data: hs[sh][0].Val(), claims: hs[sh][1].Val(), errs: hs[sh][2].Val()}
	}
	ks := keys.Val()
	slices.Sort(ks)
	return out, ks, nil
}

// splitClaim splits a claims value "attempt:due:token" as the scripts do;
// "" (no entry) is attempt 0.
func splitClaim(v string) (attempt int, due, token string) {
	parts := strings.SplitN(v, ":", 3)
	attempt, _ = strconv.Atoi(parts[0])
	if len(parts) > 1 {
		due = parts[1]
	}
	if len(parts) > 2 {
		token = parts[2]
	}
	return attempt, due, token
}

// checkInvariants checks the invariants of scripts.go on a read of the
// whole keyspace, without the model, and against the read before the step
// what may change at all: data goes only by a matching ack, a cancel or a
// purge, and an attempt count goes down only where the step may reset it
// or give one back.
func checkInvariants(prev, cur []mShard, fx mEffects) error {
	var errs []error
	bad := func(sh int, format string, a ...any) {
		if len(errs) < 10 {
			errs = append(errs, fmt.Errorf("shard %d: "+format, append([]any{sh}, a...)...))
		}
	}
	for sh, st := range cur {
		indexes := []map[string]int64{st.due, st.inflight, st.dead}
		for id := range st.data {
			n := 0
			for _, z := range indexes {
				if _, ok := z[id]; ok {
					n++
				}
			}
			if n != 1 {
				bad(sh, "data of %q is in %d of due, inflight, dead", id, n)
			}
		}
		for i, z := range indexes {
			for id := range z {
				if _, ok := st.data[id]; !ok {
					bad(sh, "%s member %q has no data", []string{"due", "inflight", "dead"}[i], id)
				}
			}
		}
		for id := range st.inflight {
			if _, _, tok := splitClaim(st.claims[id]); tok == "" {
				bad(sh, "inflight %q has no claim token (claims entry %q)", id, st.claims[id])
			}
		}
		for i, h := range []map[string]string{st.claims, st.errs} {
			for id := range h {
				if _, ok := st.data[id]; !ok {
					bad(sh, "%s entry of %q has no data", []string{"claims", "errors"}[i], id)
				}
			}
		}
		for id := range prev[sh].data {
			if _, ok := st.data[id]; !ok && !fx.deleted[id] {
				bad(sh, "%q was deleted, but not by a matching ack, a cancel or a purge", id)
			}
		}
		for id, v := range prev[sh].claims {
			was, _, _ := splitClaim(v)
			now, _, _ := splitClaim(st.claims[id])
			if now < was && !fx.reset[id] && !fx.deleted[id] && !(fx.giveBack[id] && now == was-1) {
				bad(sh, "attempt of %q went down from %d to %d", id, was, now)
			}
		}
	}
	return errors.Join(errs...)
}

// compare checks that Redis holds exactly what the model holds, and takes
// from Redis the scores the model knows only within bounds.
func (m *mModel) compare(cur []mShard, keys []string, s *Store) error {
	var errs []error
	bad := func(format string, a ...any) {
		if len(errs) < 10 {
			errs = append(errs, fmt.Errorf(format, a...))
		}
	}
	for id, e := range m.ids {
		st := cur[e.shard]
		if d, ok := st.data[id]; !ok || d != e.data {
			bad("%q: data %q, model %q", id, d, e.data)
		}
		z := map[mPlace]map[string]int64{mDue: st.due, mInflight: st.inflight, mDead: st.dead}[e.at]
		switch score, ok := z[id]; {
		case !ok:
			bad("%q: not in %v, where the model has it", id, e.at)
		case e.exact && score != e.score:
			bad("%q: %v score %d, model %d", id, e.at, score, e.score)
		case !e.exact && (score < e.lo || score > e.hi):
			bad("%q: %v score %d, model between %d and %d", id, e.at, score, e.lo, e.hi)
		default:
			e.score, e.exact = score, true
		}
		if e.claimed {
			want := fmt.Sprintf("%d:%d:%s", e.attempt, e.due, e.token)
			if got, ok := st.claims[id]; !ok || got != want {
				bad("%q: claims entry %q, model %q", id, got, want)
			}
		}
		if e.err != "" {
			if got := st.errs[id]; got != e.err {
				bad("%q: errors entry %q, model %q", id, got, e.err)
			}
		}
	}
	// Then what Redis holds and the model does not.
	var want []string
	for sh, st := range cur {
		names := s.keys[sh]
		extra := func(key string, ids iter.Seq[string], has func(e *mEntry) bool) {
			n := 0
			for id := range ids {
				n++
				if e := m.ids[id]; e == nil || e.shard != sh || !has(e) {
					bad("%s holds %q, the model does not", key, id)
				}
			}
			if n > 0 {
				want = append(want, key) // Redis drops empty keys
			}
		}
		at := func(p mPlace) func(*mEntry) bool { return func(e *mEntry) bool { return e.at == p } }
		extra(names.data, maps.Keys(st.data), func(*mEntry) bool { return true })
		extra(names.due, maps.Keys(st.due), at(mDue))
		extra(names.inflight, maps.Keys(st.inflight), at(mInflight))
		extra(names.dead, maps.Keys(st.dead), at(mDead))
		extra(names.attempts, maps.Keys(st.claims), func(e *mEntry) bool { return e.claimed })
		extra(names.errors, maps.Keys(st.errs), func(e *mEntry) bool { return e.err != "" })
	}
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		bad("keys %v, want %v", keys, want)
	}
	return errors.Join(errs...)
}
