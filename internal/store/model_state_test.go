package store

// The model of the delay set and the keyspace checks of the model test
// (model_test.go).

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
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
