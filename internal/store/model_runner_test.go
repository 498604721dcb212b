package store

// The runner of the model test (model_test.go): it applies each step to
// the real store and to the model, and compares.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

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
	r := &mRunner{ctx: ctx, s: s, rc: rc, checkEvery: checkEvery, tracing: tracing,
		seen: map[string]int{},
		m: &mModel{ids: map[string]*mEntry{}, daemons: make([][][]Claimed, 3), leased: map[int]bool{}, tokens: map[string]bool{},
			parked: map[string]int64{}}}
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
	r.fx = mEffects{deleted: map[string]bool{}, reset: map[string]bool{}}
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
		// Both caches: the scripts outside the library, and the library.
		if err := r.rc.ScriptFlush(r.ctx).Err(); err != nil {
			return err
		}
		return r.rc.FunctionFlush(r.ctx).Err()
	case opFault:
		return r.fault(o)
	case opRace:
		return r.race(o)
	case opResume:
		return r.resume()
	}
	return fmt.Errorf("op %v cannot run alone", o)
}

func storeItems(items []mItem) []Item {
	out := make([]Item, len(items))
	for i, it := range items {
		out[i] = Item{ID: it.id, Data: []byte(it.data), Absolute: true, AtMicros: 1000, Series: it.series}
		switch {
		case it.later && it.series:
			// A series' first occurrence is absolute: far ahead.
			out[i].AtMicros = farMs * 1000
		case it.later:
			out[i] = Item{ID: it.id, Data: []byte(it.data), DelayMicros: hourMs * 1000}
		}
	}
	return out
}

func (r *mRunner) schedule(items []mItem) error {
	res, errs := r.s.Schedule(r.ctx, storeItems(items))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	due := make([]int64, len(res))
	for i, x := range res {
		due[i] = wire(x)
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
		if it.series {
			r.m.ids[it.id].occurrence = 1
		}
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
		want = Cancelled{Existed: true, InFlight: e.at == mInflight || e.attempt > 0}
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
	res, err := r.s.Claim(r.ctx, shards, ClaimOptions{Batch: o.batch, Lease: time.Duration(o.lease) * time.Millisecond, Bytes: o.bytes})
	if err != nil {
		return err
	}
	if len(res) != len(shards) {
		return fmt.Errorf("claim: %d results for %d shards", len(res), len(shards))
	}
	var got []Claimed
	oversized := 0
	for i, cr := range res {
		now := cr.NowMs()
		r.now = max(r.now, now)
		want, err := r.m.claimable(shards[i], now, o.batch)
		if err != nil {
			return err
		}
		if o.bytes > 0 {
			want = r.m.withinBytes(want, max(o.bytes/int64(len(shards)), 1), cr.Oversize)
			if cr.Oversize {
				oversized++
			}
		}
		if cr.Shard != shards[i] || cr.Missing != 0 || len(cr.Items) != len(want) {
			return fmt.Errorf("claim of shard %d at %d: got %d items %v (missing %d), want %v",
				shards[i], now, len(cr.Items), claimedIDs(cr.Items), cr.Missing, want)
		}
		expired := 0
		for j, c := range cr.Items {
			e := r.m.ids[want[j]]
			attempt, due := e.attempt+1, e.due
			if c.ID != want[j] || c.Attempt != attempt || c.Base != e.base || c.DueMs != due || string(c.Data) != e.data || c.Token == "" ||
				c.Token != cr.Items[0].Token || c.Occurrence != e.occurrence {
				return fmt.Errorf("claim of shard %d at %d: item %d is %s attempt %d/%d due %d occurrence %d data %q token %q, want %s attempt %d/%d due %d occurrence %d data %q",
					shards[i], now, j, c.ID, c.Attempt, c.Base, c.DueMs, c.Occurrence, c.Data, c.Token, want[j], attempt, e.base, due, e.occurrence, e.data)
			}
			if (e.at == mInflight) != (j < cr.Expired) {
				// The scanner tells an expired lease from a retry by it.
				return fmt.Errorf("claim of shard %d at %d: item %d (%s) re-leased %v, but the first %d items are the expired leases",
					shards[i], now, j, c.ID, e.at == mInflight, cr.Expired)
			}
			if e.at == mInflight {
				expired++
				r.seen["expired lease re-claimed"]++
			} else if e.attempt > 0 {
				r.seen["retried id re-claimed"]++
			} else {
				r.seen["claimed"]++
			}
			*e = mEntry{shard: e.shard, data: e.data, at: mInflight, score: now + o.lease, exact: true,
				attempt: attempt, base: e.base, due: due, token: c.Token, err: e.err, occurrence: e.occurrence}
		}
		if len(cr.Items) > 0 {
			// A token is never handed out twice in a shard, whatever the
			// hint (the model narrows it to provoke that).
			// A token is one whole number (expiry ms × 1000 + k).
			tok := cr.Items[0].Token
			if n, err := strconv.ParseInt(tok, 10, 64); err != nil || n%1000 == 0 {
				return fmt.Errorf("claim of shard %d at %d: token %s, want a whole number, no multiple of 1000", shards[i], now, tok)
			}
			key := strconv.Itoa(shards[i]) + "/" + strconv.FormatInt(tokenNumber(tok), 10)
			if r.m.tokens[key] {
				return fmt.Errorf("claim of shard %d at %d: token %s handed out before", shards[i], now, tok)
			}
			r.m.tokens[key] = true
			r.m.leased[shards[i]] = true
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
	if o.bytes > 0 && (oversized < 1 || oversized > maxOversize) {
		return fmt.Errorf("claim with a byte budget: %d shards could go over their share, want 1..%d", oversized, maxOversize)
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
		// Held by flow control: due again at once, in an hour, or parked
		// by a pause (listed in its ledger first, as the Gate does).
		if st.Outcome == Hold {
			switch rng.IntN(3) {
			case 0:
				st.HoldUntilMs = r.now
			case 1:
				st.HoldUntilMs = r.now + hourMs
			default:
				st.HoldUntilMs = ParkedBase + it.DueMs
				if err := r.s.Park(r.ctx, mPattern, []string{it.ID}, []int64{it.DueMs}, []string{""}); err != nil {
					return err
				}
				// Listed even when its settle is stale: the resume
				// then leaves it as it is.
				r.m.parked[it.ID] = st.HoldUntilMs
			}
		}
		// As the scanner does: a delivered occurrence of a series moves
		// to the next one, due at once or in an hour.
		if st.Outcome == Next || (st.Outcome == Delivered && it.Occurrence > 0) {
			st.Outcome, st.NextDueMs = Next, 1+rng.Int64N(2)*(r.now+hourMs)
			if it.Occurrence == 0 {
				st.Outcome = Delivered
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
	ackd, err := r.s.Ack(r.ctx, byShard, time.Duration(retry)*time.Millisecond)
	if err != nil {
		return err
	}
	n, now := ackd.Settled, ackd.NowMs
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
		if st.Outcome == Next {
			*e = mEntry{shard: e.shard, data: e.data, at: mDue, score: st.NextDueMs, exact: true,
				due: st.NextDueMs, occurrence: e.occurrence + 1}
			r.fx.reset[st.ID] = true
			continue
		}
		if st.Outcome == Hold {
			// Back to due at its time, the attempt given back, no error.
			e.attempt, e.token = max(e.attempt-1, 0), ""
			e.at, e.score, e.exact = mDue, st.HoldUntilMs, true
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
			// Attempts stay (they only go up); all of them now count
			// before the replay: a fresh budget.
			*e = mEntry{shard: e.shard, data: e.data, at: mDue, lo: lo, hi: hi, due: e.due, occurrence: e.occurrence,
				attempt: e.attempt, base: e.attempt}
		}
	}
	r.seen["replayed"] += n
	if n != want {
		return fmt.Errorf("replay %v: %d were dead, want %d", ids, n, want)
	}
	return nil
}

// race runs its four calls back to back, the second claim with a lease
// shorter by the milliseconds that passed since the first, so that both
// leases usually end in the same millisecond, then settles the first claim:
// it is stale, and must not touch the new version.
func (r *mRunner) race(o mOp) error {
	sh := []int{ShardOf(o.items[0].id, modelShards)}
	var first time.Time
	for i, d := range []int{o.daemon, o.other} {
		if err := r.schedule(o.items[i : i+1]); err != nil {
			return err
		}
		lease := o.lease + raceSlack
		if i == 1 {
			lease -= min(time.Since(first).Milliseconds(), raceSlack)
		}
		if err := r.claim(mOp{kind: opClaim, daemon: d, batch: 8, lease: lease, shards: sh}); err != nil {
			return err
		}
		first = time.Now()
	}
	cl := r.m.daemons[o.daemon]
	var stale []Settle
	for back := len(cl) - 1; back >= 0 && len(stale) == 0; back-- {
		for _, c := range cl[back] {
			if c.ID == o.items[0].id && string(c.Data) == o.items[0].data {
				stale = append(stale, Settle{ID: c.ID, Token: c.Token, Outcome: Delivered})
			}
		}
	}
	if len(stale) == 0 {
		return nil // the first version was not claimable (an older lease held the id)
	}
	r.seen["race"]++
	return r.ack(stale, 0)
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

// fault puts a string where one of a shard's keys was, runs a step, and
// checks that the step failed on it and changed nothing (Redis does not
// roll back a script that stops part-way), or did not touch the key at
// all: a script reads or checks every key it touches before its first
// write (lua/prelude.lua), and one it does not touch stays a string. Such
// a step ran past the model, so its writes are undone: the shard's keys
// are restored as they were.
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
	snap, err := dumpShard(r.ctx, r.rc, r.s, o.shard)
	if err != nil {
		return err
	}
	ferr := r.failing(*o.inner)
	r.tracef("   failed with: %v", ferr)
	if ferr == nil {
		if v, err := r.rc.Get(r.ctx, k).Result(); err != nil || v != "not a "+mKeyNames[o.key] {
			return fmt.Errorf("the step succeeded and changed the key of the wrong type: %q, %v", v, err)
		}
		if err := snap.restore(r.ctx, r.rc, r.s, o.shard); err != nil {
			return err
		}
		r.seen["fault on a key the step does not touch"]++
	} else if !strings.Contains(ferr.Error(), "WRONGTYPE delayd key "+k+" ") {
		return fmt.Errorf("the step failed without naming the key of the wrong type: %w", ferr)
	}
	if err := r.rc.Del(r.ctx, k).Err(); err != nil {
		return err
	}
	if had == 1 {
		if err := r.rc.Rename(r.ctx, moved, k).Err(); err != nil {
			return err
		}
	}
	r.seen["fault"]++
	cur, _, err := readKeyspace(r.ctx, r.rc, r.s)
	if err != nil {
		return err
	}
	if !reflect.DeepEqual(cur, r.prev) {
		return fmt.Errorf("the step changed shard keys:\nbefore %+v\nafter  %+v", r.prev, cur)
	}
	return nil
}

// shardDump is every key of one shard (those of its hash tag), DUMPed,
// with its TTL.
type shardDump map[string]struct {
	v   string
	ttl time.Duration
}

func dumpShard(ctx context.Context, rc *redis.Client, s *Store, sh int) (shardDump, error) {
	keys, err := rc.Keys(ctx, "{"+s.ns+":"+strconv.Itoa(sh)+"}*").Result()
	if err != nil {
		return nil, err
	}
	out := shardDump{}
	for _, k := range keys {
		v, err := rc.Dump(ctx, k).Result()
		if err != nil {
			return nil, err
		}
		ttl, err := rc.PTTL(ctx, k).Result()
		if err != nil {
			return nil, err
		}
		out[k] = struct {
			v   string
			ttl time.Duration
		}{v, max(ttl, 0)}
	}
	return out, nil
}

// restore puts shard sh's keys back as d holds them.
func (d shardDump) restore(ctx context.Context, rc *redis.Client, s *Store, sh int) error {
	keys, err := rc.Keys(ctx, "{"+s.ns+":"+strconv.Itoa(sh)+"}*").Result()
	if err != nil {
		return err
	}
	for _, k := range keys {
		if _, ok := d[k]; !ok {
			if err := rc.Del(ctx, k).Err(); err != nil {
				return err
			}
		}
	}
	for k, e := range d {
		if err := rc.RestoreReplace(ctx, k, e.ttl, e.v).Err(); err != nil {
			return err
		}
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
		_, err := r.s.Ack(r.ctx, map[int][]Settle{r.s.Shard(o.ids[0]): sts}, 0)
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

// resume ends the model's pause: each listed id still parked where its
// hold put it goes back to its due time; one in flight stays listed; the
// others (cancelled, replaced, delivered, or listed by a stale settle)
// stay as they are and leave the list.
func (r *mRunner) resume() error {
	want, keep := 0, map[string]int64{}
	for id, sc := range r.m.parked {
		switch e := r.m.ids[id]; {
		case e != nil && e.at == mDue && e.exact && e.score == sc:
			e.score = sc - ParkedBase
			want++
		case e != nil && e.at == mInflight:
			// Perhaps on its way to being held: it stays listed, and
			// the pause's marker with it, for a later resume.
			keep[id] = sc
		}
	}
	_, n, err := r.s.Resume(r.ctx, mPattern)
	if err != nil {
		return err
	}
	r.m.parked = keep
	r.seen["resumed"] += n
	if n != want {
		return fmt.Errorf("resume released %d, want %d", n, want)
	}
	return nil
}
