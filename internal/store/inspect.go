package store

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
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
	// StatePaused: pending, parked by a pause of its target (flow.go);
	// DueMs is its own due time.
	StatePaused State = "paused"
)

// pendingState is the state of a pending envelope at due score due, and
// its due time.
func pendingState(due int64) (State, int64) {
	if due >= ParkedBase {
		return StatePaused, due - ParkedBase
	}
	return StatePending, due
}

// Entry is one stored envelope as inspection sees it.
type Entry struct {
	ID       string
	Shard    int
	State    State
	DueMs    int64 // due time (pending), lease expiry (inflight) or death time (dead)
	Attempts int
	Error    string // last delivery error, while retrying or dead
	// Occurrence is the pending occurrence of a series (from 1), 0 for a
	// one-shot.
	Occurrence int64
	Data       []byte
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
	_, occurrence, d := splitValue(data.Val())
	e := Entry{ID: id, Shard: sh, Data: d, Occurrence: occurrence, Attempts: parseAttempts(attempts.Val()), Error: lastErr.Val()}
	switch {
	case inflight.Err() == nil:
		// The attempt under way counts too.
		e.State, e.DueMs, e.Attempts = StateInflight, leaseEnd(inflight.Val()), e.Attempts+1
	case dead.Err() == nil:
		e.State, e.DueMs = StateDead, int64(dead.Val())
	case due.Err() == nil:
		e.State, e.DueMs = pendingState(int64(due.Val()))
	default:
		// In no index (a script cut part-way, which Check repairs): at its
		// header's due time.
		dueMs, _, _ := splitValue(data.Val())
		e.State, e.DueMs = StatePending, dueMs
	}
	return e, nil
}

// parseAttempts reads an attempts value, "n" or "n/b" (keys.go), as the
// scripts do (attemptsOf in lua/prelude.lua): the attempts counted before
// the current lease, 0 for "".
func parseAttempts(v string) int {
	n, _, _ := strings.Cut(v, "/")
	a, _ := strconv.Atoi(n)
	return a
}

// Cursor is where a List call stopped: the due time and id of the last
// entry returned. Pages continue after it in (due, id) order, the order
// Redis keeps each sorted set in, so a cursor stays valid while entries
// come and go. The zero Cursor is the start.
type Cursor struct {
	DueMs int64
	ID    string
}

// String encodes the cursor for a client to send back: due ms, "-", and
// the id in unpadded base64url, so any id is safe on a command line.
func (c Cursor) String() string {
	if c.ID == "" {
		return ""
	}
	return strconv.FormatInt(c.DueMs, 10) + "-" + base64.RawURLEncoding.EncodeToString([]byte(c.ID))
}

// ParseCursor decodes a cursor; an empty string is the start.
func ParseCursor(s string) (Cursor, error) {
	if s == "" {
		return Cursor{}, nil
	}
	a, b, ok := strings.Cut(s, "-")
	due, err1 := strconv.ParseInt(a, 10, 64)
	id, err2 := base64.RawURLEncoding.DecodeString(b)
	if !ok || err1 != nil || err2 != nil || len(id) == 0 {
		return Cursor{}, fmt.Errorf("bad cursor %q", s)
	}
	return Cursor{DueMs: due, ID: string(id)}, nil
}

// ListOptions select a page of List.
type ListOptions struct {
	State     State // pending (default) or dead
	DueBefore int64 // ms; 0 = no bound
	Limit     int
	Cursor    Cursor
}

// List returns up to Limit entries of one state in due order across all
// shards (ties by id), starting after the cursor, and the cursor of the
// next page; done is true when nothing follows. It is a k-way merge: each
// shard gives at most Limit+1 entries after the cursor (found by rank, a
// binary search only inside a run of equal due times), so a page reads
// O(Limit × shards) entries and never scans a set. Callers filter
// further (by target) per page.
func (s *Store) List(ctx context.Context, o ListOptions) (entries []Entry, next Cursor, done bool, err error) {
	if o.Limit <= 0 {
		return nil, o.Cursor, false, errors.New("store: list: limit must be positive")
	}
	sets := make([]string, s.shards)
	for sh, k := range s.keys {
		sets[sh] = k.due
		if o.State == StateDead {
			sets[sh] = k.dead
		}
	}
	start, err := s.ranksAfter(ctx, sets, o.Cursor)
	if err != nil {
		return nil, o.Cursor, false, err
	}

	pipe := s.rdb.Pipeline()
	ranges := make([]*redis.ZSliceCmd, s.shards)
	for sh, set := range sets {
		ranges[sh] = pipe.ZRangeWithScores(ctx, set, start[sh], start[sh]+int64(o.Limit))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, o.Cursor, false, fmt.Errorf("store: list: %w", err)
	}
	type cand struct {
		shard int
		id    string
		due   int64
	}
	var cands []cand
	for sh, r := range ranges {
		for _, z := range r.Val() {
			due := int64(z.Score)
			if o.DueBefore > 0 && due >= o.DueBefore {
				break
			}
			id, _ := z.Member.(string)
			cands = append(cands, cand{sh, id, due})
		}
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if c := cmp.Compare(a.due, b.due); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	// Every shard gave Limit+1 entries if it had them: one candidate
	// beyond Limit proves a next page, and none proves there is not.
	done = len(cands) <= o.Limit
	cands = cands[:min(len(cands), o.Limit)]
	if len(cands) == 0 {
		return nil, o.Cursor, true, nil
	}

	byShard := map[int][]int{}
	for i, c := range cands {
		byShard[c.shard] = append(byShard[c.shard], i)
	}
	pipe = s.rdb.Pipeline()
	type reads struct{ data, att, errs *redis.SliceCmd }
	rs := map[int]reads{}
	for sh, idx := range byShard {
		ids := make([]string, len(idx))
		for j, i := range idx {
			ids[j] = cands[i].id
		}
		k := s.keys[sh]
		rs[sh] = reads{pipe.HMGet(ctx, k.data, ids...), pipe.HMGet(ctx, k.attempts, ids...), pipe.HMGet(ctx, k.errors, ids...)}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, o.Cursor, false, fmt.Errorf("store: list: %w", err)
	}
	state := StatePending
	if o.State == StateDead {
		state = StateDead
	}
	entries = make([]Entry, len(cands))
	for sh, idx := range byShard {
		r := rs[sh]
		for j, i := range idx {
			d, _ := r.data.Val()[j].(string)
			a, _ := r.att.Val()[j].(string)
			e, _ := r.errs.Val()[j].(string)
			c := cands[i]
			_, occurrence, data := splitValue(d)
			entries[i] = Entry{ID: c.id, Shard: sh, State: state, DueMs: c.due, Attempts: parseAttempts(a), Error: e,
				Occurrence: occurrence, Data: data}
			if state == StatePending {
				entries[i].State, entries[i].DueMs = pendingState(c.due)
			}
		}
	}
	last := cands[len(cands)-1]
	return entries, Cursor{DueMs: last.due, ID: last.id}, done, nil
}

// ranksAfter returns, per set, the rank of the first member after the
// cursor in (score, member) order. Members with a lower score are
// counted with ZCOUNT; within the run of members that share the cursor's
// score, which Redis orders bytewise like Go strings, a binary search by
// rank finds the first member above the cursor's id. Each step is one
// pipeline over the shards still searching; a run of n equal due times
// costs log2(n) steps, and no run costs none.
func (s *Store) ranksAfter(ctx context.Context, sets []string, c Cursor) ([]int64, error) {
	lo := make([]int64, len(sets))
	if c.ID == "" {
		return lo, nil
	}
	hi := make([]int64, len(sets))
	score := strconv.FormatInt(c.DueMs, 10)
	pipe := s.rdb.Pipeline()
	below := make([]*redis.IntCmd, len(sets))
	upTo := make([]*redis.IntCmd, len(sets))
	for sh, set := range sets {
		below[sh] = pipe.ZCount(ctx, set, "-inf", "("+score)
		upTo[sh] = pipe.ZCount(ctx, set, "-inf", score)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("store: list: %w", err)
	}
	for sh := range sets {
		lo[sh], hi[sh] = below[sh].Val(), upTo[sh].Val()
	}
	for {
		pipe := s.rdb.Pipeline()
		probes := map[int]*redis.StringSliceCmd{}
		for sh, set := range sets {
			if lo[sh] < hi[sh] {
				mid := (lo[sh] + hi[sh]) / 2
				probes[sh] = pipe.ZRange(ctx, set, mid, mid)
			}
		}
		if len(probes) == 0 {
			return lo, nil
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("store: list: %w", err)
		}
		for sh, p := range probes {
			mid := (lo[sh] + hi[sh]) / 2
			// A member gone since the count leaves the probe empty or
			// shifted; the page is still in order, at worst it repeats
			// or skips an entry that moved while we looked.
			if m := p.Val(); len(m) == 1 && m[0] <= c.ID {
				lo[sh] = mid + 1
			} else {
				hi[sh] = mid
			}
		}
	}
}
