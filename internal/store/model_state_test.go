package store

// The model of the delay set and the keyspace checks of the model test
// (model_test.go).

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

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
// its attempts and errors entries.
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
	// attempt is the attempt number of the latest claim while in flight,
	// else the attempts counted so far; base is how many were counted
	// before the last replay.
	attempt, base int
	due           int64  // the original due time, from the schedule
	token         string // the lease score of the current claim, "" once settled
	// occurrence is the pending occurrence of a series, 0 for a one-shot.
	occurrence int64
	err        string // the errors entry, "" if none
}

// mModel is the delay set as plain Go: every stored id, and what each
// simulated daemon has claimed.
type mModel struct {
	ids     map[string]*mEntry
	daemons [][][]Claimed // per daemon its latest claims, oldest first
	// leased: the shard handed out a token, so its lease hash exists.
	leased map[int]bool
	// tokens are every token each shard handed out: none may repeat.
	tokens map[string]bool
	// parked is the ledger of the pause of mPattern: id → the due score
	// its hold parked it at (ParkedBase + its due time).
	parked map[string]int64
}

// mPattern is the target pattern the model's holds park under.
const mPattern = "m.>"

// mEffects are what the model allows one step to do, for the invariant
// checks that compare the keyspace before and after it.
type mEffects struct {
	deleted map[string]bool // by a matching ack, a cancel or a purge
	reset   map[string]bool // attempts start over: a replace, a series' next occurrence
}

// put stores a new version of id, as a schedule does.
func (m *mModel) put(id, data string, due int64, fx mEffects) {
	if m.ids[id] != nil {
		fx.reset[id] = true // a replace forgets the old claim
	}
	m.ids[id] = &mEntry{shard: ShardOf(id, modelShards), data: data, at: mDue, score: due, exact: true, due: due}
}

// counted is what the attempts hash must hold for e: the attempts counted
// before the current lease (no entry for 0).
func (e *mEntry) counted() int {
	if e.at == mInflight {
		return e.attempt - 1
	}
	return e.attempt
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
		// A lease score is its token, whose expiry is
		// e.score: it is claimable from the next millisecond on.
		if e.score > now || (e.at == mInflight && e.score == now) {
			continue
		}
		switch e.at {
		case mInflight:
			exp = append(exp, id)
		case mDue:
			due = append(due, id)
		}
	}
	// ZSET order: by score, a lease's with its token, then bytewise by id.
	score := func(e *mEntry) float64 {
		if e.at == mInflight {
			return e.leaseScore()
		}
		return float64(e.score)
	}
	order := func(ids []string) {
		sort.Slice(ids, func(i, j int) bool {
			a, b := score(m.ids[ids[i]]), score(m.ids[ids[j]])
			if a != b {
				return a < b
			}
			return ids[i] < ids[j]
		})
	}
	order(exp)
	order(due)
	exp = exp[:min(len(exp), batch)]
	return append(exp, due[:min(len(due), batch-len(exp))]...), nil
}

// withinBytes keeps of ids what a claim with a byte budget hands out
// (take in lua/claim.lua): values of at most budget/16 bytes while the
// kept bytes stay within budget or their own within a quarter of it,
// larger ones while those stay within three quarters or, with oversize,
// the first of them whatever its size; one that does not fit is skipped
// and the rest still offered.
func (m *mModel) withinBytes(ids []string, budget int64, oversize bool) []string {
	var bytes, small, large int64
	tookLarge := false
	var keep []string
	for _, id := range ids {
		e := m.ids[id]
		size := int64(valueHeader) + int64(len(e.data))
		if e.occurrence > 0 {
			size = seriesValueHeader + int64(len(e.data))
		}
		if 16*size <= budget {
			if bytes+size > budget && 4*(small+size) > budget {
				continue
			}
			small += size
		} else {
			if 4*(large+size) > 3*budget && (tookLarge || !oversize) {
				continue
			}
			large, tookLarge = large+size, true
		}
		bytes += size
		keep = append(keep, id)
	}
	return keep
}

// next returns the lowest score at p in shard, or -1; for leases, the
// millisecond the lowest expires in (its score rounded up).
func (m *mModel) next(shard int, p mPlace) int64 {
	low := int64(-1)
	for _, e := range m.ids {
		if e.shard == shard && e.at == p && (low < 0 || e.score < low) {
			low = e.score
		}
	}
	if p == mInflight && low >= 0 {
		low++
	}
	return low
}

// isLeaseToken: a lease score (keys.go, inflight): a whole number that is
// no multiple of 1000.
func isLeaseToken(l float64) bool {
	return l > 0 && l == math.Trunc(l) && int64(l)%1000 != 0
}

// leaseScore is the lease score the model expects in Redis for e's claim.
func (e *mEntry) leaseScore() float64 {
	f, _ := strconv.ParseFloat(e.token, 64)
	return f
}

// tokenNumber is a token of either form as one number, expiry ms × 1000 +
// k.
func tokenNumber(tok string) int64 {
	n, _ := strconv.ParseInt(tok, 10, 64)
	return n
}

// mShard is one shard's keys as read directly from Redis.
type mShard struct {
	due, inflight, dead  map[string]int64
	leases               map[string]float64 // inflight scores, with their token
	data, attempts, errs map[string]string
	dataDue              map[string]int64 // the due time in each data value's header
	dataOcc              map[string]int64 // and the occurrence
}

// readKeyspace reads every shard's keys, and the names
// of all keys, in one round trip.
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
		leases := map[string]float64{}
		for i, c := range zs[sh] {
			z[i] = make(map[string]int64, len(c.Val()))
			for _, m := range c.Val() {
				z[i][m.Member.(string)] = int64(m.Score)
				if i == 1 {
					z[i][m.Member.(string)] = leaseEnd(m.Score)
					leases[m.Member.(string)] = m.Score
				}
			}
		}
		data, dataDue, dataOcc := map[string]string{}, map[string]int64{}, map[string]int64{}
		for id, v := range hs[sh][0].Val() {
			due, occ, d := splitValue(v)
			data[id], dataDue[id], dataOcc[id] = string(d), due, occ
		}
		out[sh] = mShard{due: z[0], inflight: z[1], dead: z[2], leases: leases, data: data, dataDue: dataDue, dataOcc: dataOcc,
			attempts: hs[sh][1].Val(), errs: hs[sh][2].Val()}
	}
	ks := keys.Val()
	slices.Sort(ks)
	return out, ks, nil
}

// splitAttempts reads an attempts value as the scripts do: the attempts
// counted, and how many before the last replay; "" (no entry) is 0, 0.
func splitAttempts(v string) (n, b int, ok bool) {
	a, c, replayed := strings.Cut(v, "/")
	n, err := strconv.Atoi(a)
	if replayed {
		var err2 error
		b, err2 = strconv.Atoi(c)
		err = errors.Join(err, err2)
	}
	return n, b, err == nil && n > 0 && b >= 0 && b <= n && (!replayed || b > 0)
}

// attemptsText is the attempts value the scripts write for n and b.
func attemptsText(n, b int) string {
	if b > 0 {
		return strconv.Itoa(n) + "/" + strconv.Itoa(b)
	}
	return strconv.Itoa(n)
}

// checkInvariants checks the invariants of keys.go on a read of the
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
		for id, l := range st.leases {
			if !isLeaseToken(l) {
				bad(sh, "inflight %q has a lease score without a token: %v", id, l)
			}
		}
		for id, v := range st.attempts {
			if _, _, ok := splitAttempts(v); !ok {
				bad(sh, "attempts entry of %q is %q, not a positive count n or n/b with 0 < b <= n", id, v)
			}
		}
		for i, h := range []map[string]string{st.attempts, st.errs} {
			for id := range h {
				if _, ok := st.data[id]; !ok {
					bad(sh, "%s entry of %q has no data", []string{"attempts", "errors"}[i], id)
				}
			}
		}
		for id := range prev[sh].data {
			if _, ok := st.data[id]; !ok && !fx.deleted[id] {
				bad(sh, "%q was deleted, but not by a matching ack, a cancel or a purge", id)
			}
		}
		for id, v := range prev[sh].attempts {
			was, _, _ := splitAttempts(v)
			now, _, _ := splitAttempts(st.attempts[id])
			if now < was && !fx.reset[id] && !fx.deleted[id] {
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
		if d, ok := st.data[id]; !ok || d != e.data || st.dataDue[id] != e.due || st.dataOcc[id] != e.occurrence {
			bad("%q: data %q due %d occurrence %d, model %q due %d occurrence %d", id, d, st.dataDue[id], st.dataOcc[id],
				e.data, e.due, e.occurrence)
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
		if n := e.counted(); n > 0 {
			if got, ok := st.attempts[id]; !ok || got != attemptsText(n, e.base) {
				bad("%q: attempts entry %q, model %s", id, got, attemptsText(n, e.base))
			}
		}
		if e.at == mInflight {
			if l := e.leaseScore(); st.leases[id] != l || leaseEnd(l) != e.score || !isLeaseToken(l) {
				bad("%q: lease score %v, model %d with token %q", id, st.leases[id], e.score, e.token)
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
		extra(names.attempts, maps.Keys(st.attempts), func(e *mEntry) bool { return e.counted() > 0 })
		extra(names.errors, maps.Keys(st.errs), func(e *mEntry) bool { return e.err != "" })
		if m.leased[sh] {
			want = append(want, names.lease)
		}
	}
	if len(m.parked) > 0 {
		// The pause's ledger, and the rules hash with its parked marker.
		want = append(want, flowKey(s.ns), s.flowKeys("parked", mPattern))
	}
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		bad("keys %v, want %v", keys, want)
	}
	return errors.Join(errs...)
}
