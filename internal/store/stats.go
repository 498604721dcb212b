package store

// What the store reports of itself as a whole: the shards' sizes, its
// readiness, the pending envelopes by due time, and the stored formats and
// lease forms it holds (for delayd doctor and the upgrade notes).

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/envelope"
)

// ShardStats are one shard's sizes and its next due time.
type ShardStats struct {
	Shard  int
	Counts Counts
	// NextDueMs is -1 when nothing is pending, or all that is pending is
	// parked by a pause (flow.go): it falls due only with its resume.
	NextDueMs int64
}

// Stats returns the sizes and next due time of the given shards (all when
// none are given) in one pipeline of O(1)/O(log n) commands, plus Redis'
// current time in ms.
func (s *Store) Stats(ctx context.Context, shards ...int) ([]ShardStats, int64, error) {
	if len(shards) == 0 {
		shards = make([]int, s.shards)
		for i := range shards {
			shards[i] = i
		}
	}
	pipe := s.rdb.Pipeline()
	type cmds struct {
		p, i, d *redis.IntCmd
		next    *redis.ZSliceCmd
	}
	cs := make([]cmds, len(shards))
	for j, sh := range shards {
		k := s.keys[sh]
		cs[j] = cmds{pipe.ZCard(ctx, k.due), pipe.ZCard(ctx, k.inflight), pipe.ZCard(ctx, k.dead), pipe.ZRangeWithScores(ctx, k.due, 0, 0)}
	}
	now := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, 0, fmt.Errorf("store: stats: %w", err)
	}
	out := make([]ShardStats, len(shards))
	for j, c := range cs {
		out[j] = ShardStats{Shard: shards[j], Counts: Counts{Pending: c.p.Val(), Inflight: c.i.Val(), Dead: c.d.Val()}, NextDueMs: -1}
		if z := c.next.Val(); len(z) > 0 && int64(z[0].Score) < ParkedBase {
			out[j].NextDueMs = int64(z[0].Score)
		}
	}
	return out, now.Val().UnixMilli(), nil
}

// Ready reports whether Redis answers and still has the library and
// every script cached (a restart, FUNCTION FLUSH or SCRIPT FLUSH empties
// them; the next call reloads them).
func (s *Store) Ready(ctx context.Context) error {
	if s.lib != nil && !s.noFunctions.Load() {
		switch loaded, err := s.libraryLoaded(ctx); {
		case err == nil && !loaded, err != nil && noFunctions(err):
			return s.Ping(ctx) // (re)load, or find there are no functions; then ready
		case err != nil:
			return fmt.Errorf("redis: %w", err)
		}
	}
	var shas []string
	for _, sc := range allScripts {
		if s.fn(sc) == "" {
			shas = append(shas, s.pick(sc).Hash())
		}
	}
	ok, err := s.rdb.ScriptExists(ctx, shas...).Result()
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	for _, v := range ok {
		if !v {
			return s.Ping(ctx) // reload, then ready
		}
	}
	return nil
}

// DueCounts counts pending envelopes per due-time bucket across all
// shards: bucket i holds due times in [edges[i-1], edges[i]) (the first
// from -inf, and one more bucket from the last edge to +inf). One ZCOUNT
// per bucket and shard, O(log n) each, in one pipeline: never a scan.
func (s *Store) DueCounts(ctx context.Context, edgesMs []int64) ([]int64, error) {
	pipe := s.rdb.Pipeline()
	n := len(edgesMs) + 1
	cmds := make([][]*redis.IntCmd, s.shards)
	for sh, k := range s.keys {
		cmds[sh] = make([]*redis.IntCmd, n)
		for b := range n {
			lo, hi := "-inf", "+inf"
			if b > 0 {
				lo = strconv.FormatInt(edgesMs[b-1], 10)
			}
			if b < len(edgesMs) {
				hi = "(" + strconv.FormatInt(edgesMs[b], 10)
			}
			cmds[sh][b] = pipe.ZCount(ctx, k.due, lo, hi)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("store: due counts: %w", err)
	}
	out := make([]int64, n)
	for _, cs := range cmds {
		for b, c := range cs {
			out[b] += c.Val()
		}
	}
	return out, nil
}

// Formats counts the stored values of every shard by format (FormatBare,
// FormatIntegerLeases for the header formats 2 to 4 share, or newer ones
// a newer daemon wrote), for doctor: an upgrade or rollback shows how much
// each version has written.
//
// A value of a format this version reads that does not decode counts as
// FormatUnreadable: junk without a value mark would otherwise pass for
// format 1.
func (s *Store) Formats(ctx context.Context) (map[int]int, error) {
	out := map[int]int{}
	for sh := range s.shards {
		var cursor uint64
		for {
			kv, next, err := s.rdb.HScan(ctx, s.keys[sh].data, cursor, "", 500).Result()
			if err != nil {
				return nil, fmt.Errorf("store: formats of shard %d: %w", sh, err)
			}
			for i := 1; i < len(kv); i += 2 {
				out[readableFormat(kv[i])]++
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	return out, nil
}

// readableFormat is the format of a stored value, or FormatUnreadable when
// it is of a format this version reads but does not decode.
func readableFormat(v string) int {
	f := formatOf(v)
	if f > formatNext {
		return f // a newer version's: not ours to judge
	}
	dueMs, _, data := splitValue(v)
	if f != FormatBare && dueMs < 0 {
		return FormatUnreadable // a mark, but too short for its header
	}
	if _, err := envelope.Decode(data); err != nil {
		return FormatUnreadable
	}
	return f
}
