package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrNotFound is returned for an id that is not stored.
var ErrNotFound = errors.New("not found")

// State is where an envelope is in its life.
type State string

// The states of a stored envelope.
const (
	StatePending  State = "pending"
	StateInflight State = "inflight"
	StateDead     State = "dead"
)

// Entry is one stored envelope as inspection sees it.
type Entry struct {
	ID       string
	Shard    int
	State    State
	DueMs    int64 // due time (pending), lease expiry (inflight) or death time (dead)
	Attempts int
	Error    string // last delivery error, while retrying or dead
	Data     []byte
}

// Get returns the envelope with id, wherever it is, in one round trip.
func (s *Store) Get(ctx context.Context, id string) (Entry, error) {
	sh := s.Shard(id)
	k := s.keys[sh]
	pipe := s.rdb.Pipeline()
	data := pipe.HGet(ctx, k.data, id)
	due := pipe.ZScore(ctx, k.due, id)
	inflight := pipe.ZScore(ctx, k.inflight, id)
	dead := pipe.ZScore(ctx, k.dead, id)
	attempts := pipe.HGet(ctx, k.attempts, id)
	lastErr := pipe.HGet(ctx, k.errors, id)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return Entry{}, fmt.Errorf("store: get %q: %w", id, err)
	}
	if data.Err() != nil {
		return Entry{}, ErrNotFound
	}
	e := Entry{ID: id, Shard: sh, Data: []byte(data.Val()), Attempts: parseAttempts(attempts.Val()), Error: lastErr.Val()}
	switch {
	case inflight.Err() == nil:
		e.State, e.DueMs = StateInflight, int64(inflight.Val())
	case dead.Err() == nil:
		e.State, e.DueMs = StateDead, int64(dead.Val())
	default:
		e.State, e.DueMs = StatePending, int64(due.Val())
	}
	return e, nil
}

// parseAttempts reads the "attempts:due" value the claim script keeps.
func parseAttempts(v string) int {
	n, _ := strconv.Atoi(strings.SplitN(v, ":", 2)[0])
	return n
}

// Cursor is where a List call stopped: a shard and an offset in its set.
type Cursor struct {
	Shard  int
	Offset int64
}

// String encodes the cursor for a client to send back.
func (c Cursor) String() string { return strconv.Itoa(c.Shard) + ":" + strconv.FormatInt(c.Offset, 10) }

// ParseCursor decodes a cursor; an empty string is the start.
func ParseCursor(s string) (Cursor, error) {
	if s == "" {
		return Cursor{}, nil
	}
	a, b, ok := strings.Cut(s, ":")
	sh, err1 := strconv.Atoi(a)
	off, err2 := strconv.ParseInt(b, 10, 64)
	if !ok || err1 != nil || err2 != nil || sh < 0 || off < 0 {
		return Cursor{}, fmt.Errorf("bad cursor %q", s)
	}
	return Cursor{Shard: sh, Offset: off}, nil
}

// ListOptions select a page of List.
type ListOptions struct {
	State     State // pending (default) or dead
	DueBefore int64 // ms; 0 = no bound
	Limit     int
	Cursor    Cursor
}

// List returns up to Limit entries of one state, shard by shard in due
// order within each shard, starting at the cursor, and the cursor of the
// next page (done when there is none). It reads at most Limit entries per
// call: never a full scan. Callers filter further (by target) per page.
func (s *Store) List(ctx context.Context, o ListOptions) (entries []Entry, next Cursor, done bool, err error) {
	max := "+inf"
	if o.DueBefore > 0 {
		max = "(" + strconv.FormatInt(o.DueBefore, 10)
	}
	cur := o.Cursor
	for cur.Shard < s.shards && len(entries) < o.Limit {
		k := s.keys[cur.Shard]
		set := k.due
		if o.State == StateDead {
			set = k.dead
		}
		want := int64(o.Limit - len(entries))
		zs, err := s.rdb.ZRangeByScoreWithScores(ctx, set, &redis.ZRangeBy{Min: "-inf", Max: max, Offset: cur.Offset, Count: want}).Result()
		if err != nil {
			return nil, cur, false, fmt.Errorf("store: list shard %d: %w", cur.Shard, err)
		}
		if len(zs) > 0 {
			ids := make([]string, len(zs))
			for i, z := range zs {
				ids[i], _ = z.Member.(string)
			}
			pipe := s.rdb.Pipeline()
			data := pipe.HMGet(ctx, k.data, ids...)
			att := pipe.HMGet(ctx, k.attempts, ids...)
			errs := pipe.HMGet(ctx, k.errors, ids...)
			if _, err := pipe.Exec(ctx); err != nil {
				return nil, cur, false, fmt.Errorf("store: list shard %d: %w", cur.Shard, err)
			}
			for i, z := range zs {
				d, _ := data.Val()[i].(string)
				a, _ := att.Val()[i].(string)
				e, _ := errs.Val()[i].(string)
				state := StatePending
				if o.State == StateDead {
					state = StateDead
				}
				entries = append(entries, Entry{ID: ids[i], Shard: cur.Shard, State: state, DueMs: int64(z.Score), Attempts: parseAttempts(a), Error: e, Data: []byte(d)})
			}
		}
		if int64(len(zs)) < want {
			cur = Cursor{Shard: cur.Shard + 1}
			continue
		}
		cur.Offset += int64(len(zs))
	}
	return entries, cur, cur.Shard >= s.shards, nil
}

// ShardStats are one shard's sizes and its next due time.
type ShardStats struct {
	Shard     int
	Counts    Counts
	NextDueMs int64 // -1 when nothing is pending
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
		cs[j] = cmds{pipe.ZCard(ctx, k.due), pipe.ZCard(ctx, k.inflight), pipe.ZCard(ctx, k.dead),
			pipe.ZRangeWithScores(ctx, k.due, 0, 0)}
	}
	now := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, 0, fmt.Errorf("store: stats: %w", err)
	}
	out := make([]ShardStats, len(shards))
	for j, c := range cs {
		out[j] = ShardStats{Shard: shards[j], Counts: Counts{Pending: c.p.Val(), Inflight: c.i.Val(), Dead: c.d.Val()}, NextDueMs: -1}
		if z := c.next.Val(); len(z) > 0 {
			out[j].NextDueMs = int64(z[0].Score)
		}
	}
	return out, now.Val().UnixMilli(), nil
}

// Ready reports whether Redis answers and still has every script cached
// (a restart or SCRIPT FLUSH empties the cache; the next call reloads it).
func (s *Store) Ready(ctx context.Context) error {
	shas := make([]string, len(allScripts))
	for i, sc := range allScripts {
		shas[i] = s.pick(sc).Hash()
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
