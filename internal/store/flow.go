package store

// Flow control's state, fleet-wide: the rules (rate limits and pauses on
// target patterns) in one HASH, and per rule the envelopes it holds. A
// held envelope is an ordinary pending one: in due, at a later score, its
// attempts untouched (Hold). So it stays cancellable, visible and counted,
// and nothing else in the store knows of flow control.
//
//   - A limit's slots: reserve.lua, GCRA on "<flow>:tat:<pattern>", the
//     held ids in the ledger "<flow>:slots:<pattern>" (id → slot ms).
//   - A pause parks the envelopes its targets claim at ParkedBase + their
//     due time, beyond every real due time, and lists them in
//     "<flow>:parked:<pattern>" (id → that score); Resume moves them back
//     to their due time, in due order.
//
// Every key shares the hash tag of flowKey: one Cluster slot.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
)

// ParkedBase is added to a paused envelope's due time while it is parked:
// 10^15 ms, past year 33000, so beyond envelope.MaxDue, and exact as a
// ZSET score with any due time added.
const ParkedBase = int64(1e15)

// Limit is a rate limit on the targets matching Pattern: at most one
// delivery per Interval, after a burst of Burst at once.
type Limit struct {
	Pattern string
	// Rate is the limit as it was set ("500/s"), for display.
	Rate       string
	IntervalUs int64
	Burst      int
}

// FlowRules are the fleet's rules: its limits and its pauses (pattern →
// when paused, Redis ms); the patterns whose lists may still hold
// envelopes (Parked: a pause's, Slotted: a limit's), for the daemons to
// release when their rule is gone (Leftover); and the fields that are not
// a rule delayd wrote (Bad), left out.
type FlowRules struct {
	Limits          []Limit
	Paused          map[string]int64
	Parked, Slotted []string
	Bad             []string
}

// The fields of flowKey: a kind, then the pattern.
const (
	fieldLimit   = "limit:"
	fieldPause   = "pause:"
	fieldParked  = "parked:"
	fieldSlotted = "slotted:"
)

func (s *Store) flowKeys(kind, pattern string) string {
	return flowKey(s.ns) + ":" + kind + ":" + pattern
}

// FlowRules reads the fleet's rules.
func (s *Store) FlowRules(ctx context.Context) (FlowRules, error) {
	h, err := s.rdb.HGetAll(ctx, flowKey(s.ns)).Result()
	if err != nil {
		return FlowRules{}, fmt.Errorf("store: flow rules: %w", err)
	}
	r := FlowRules{Paused: map[string]int64{}}
	for f, v := range h {
		switch {
		case !utf8.ValidString(f):
			// Written by hand: a pattern must be UTF-8 to be a metric's
			// label (the daemons' metrics panicked on one).
			r.Bad = append(r.Bad, f+"="+v)
		case strings.HasPrefix(f, fieldLimit):
			l, ok := parseLimit(v)
			if !ok {
				// One bad field must not switch every rule off: the rest
				// stand, and the caller says which is left out.
				r.Bad = append(r.Bad, f+"="+v)
				continue
			}
			l.Pattern = strings.TrimPrefix(f, fieldLimit)
			r.Limits = append(r.Limits, l)
		case strings.HasPrefix(f, fieldPause):
			since, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				r.Bad = append(r.Bad, f+"="+v)
			}
			r.Paused[strings.TrimPrefix(f, fieldPause)] = since // a pause stands whatever its time says
		case strings.HasPrefix(f, fieldParked):
			r.Parked = append(r.Parked, strings.TrimPrefix(f, fieldParked))
		case strings.HasPrefix(f, fieldSlotted):
			r.Slotted = append(r.Slotted, strings.TrimPrefix(f, fieldSlotted))
		default:
			r.Bad = append(r.Bad, f+"="+v)
		}
	}
	slices.SortFunc(r.Limits, func(a, b Limit) int { return strings.Compare(a.Pattern, b.Pattern) })
	slices.Sort(r.Parked)
	slices.Sort(r.Slotted)
	slices.Sort(r.Bad)
	return r, nil
}

// parseLimit reads a limit's field value, "<rate> <interval µs> <burst>",
// as reserve.lua reads it.
func parseLimit(v string) (Limit, bool) {
	f := strings.Split(v, " ")
	if len(f) != 3 || f[0] == "" || strings.ContainsFunc(f[0], unicode.IsSpace) {
		return Limit{}, false
	}
	interval, err1 := strconv.ParseInt(f[1], 10, 64)
	burst, err2 := strconv.Atoi(f[2])
	if err1 != nil || err2 != nil || interval <= 0 || burst < 1 {
		return Limit{}, false
	}
	return Limit{Rate: f[0], IntervalUs: interval, Burst: burst}, true
}

// SetLimit sets (or changes) the limit on l.Pattern: every daemon's next
// slot of it follows the new rate. A change re-paces what the old one
// held: those envelopes are put back in due, in their order, to get new
// slots at the new rate (raising a limit is how an operator drains its
// backlog sooner; kept, the old slots would hold even new envelopes
// behind them at the old pace).
func (s *Store) SetLimit(ctx context.Context, l Limit) error {
	v := fmt.Sprintf("%s %d %d", l.Rate, l.IntervalUs, l.Burst)
	if _, ok := parseLimit(v); !ok {
		return fmt.Errorf("store: limit %q: bad rate %q, interval %d µs or burst %d", l.Pattern, l.Rate, l.IntervalUs, l.Burst)
	}
	// Read first, then the rule and the clocks in one step: a Reserve
	// between a rule written alone and its clocks read would apply the
	// new interval to the old clocks, and the conversion below again (a
	// review found clocks 410 years ahead).
	key := s.flowKeys("tat", l.Pattern)
	pipe := s.rdb.Pipeline()
	nowCmd, old, state := pipe.Time(ctx), pipe.HGet(ctx, flowKey(s.ns), fieldLimit+l.Pattern), pipe.Get(ctx, key)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("store: set limit: %w", err)
	}
	was := old.Val()
	tx := s.rdb.TxPipeline()
	tx.HSet(ctx, flowKey(s.ns), fieldLimit+l.Pattern, v)
	if was != "" && was != v {
		// A change: the slots given start afresh, behind the deliveries
		// let go, whose clock stays, in deliveries rather than in time
		// (dropped, a second burst went at once: a review saw 10 in 50
		// ms at burst 5; kept in time, a change from 1/h waited the old
		// hour). At most a full burst of the new rule is spent: more
		// would count the envelopes the re-pace below slots again, and
		// the old rule's slack as deliveries.
		nowUs := nowCmd.Val().UnixMicro()
		ahead := float64(max(parseLimitState(state.Val()).sentUs-nowUs, 0))
		if prev, ok := parseLimit(was); ok {
			ahead *= float64(l.IntervalUs) / float64(prev.IntervalUs)
		}
		sent := nowUs + int64(min(ahead, float64(int64(l.Burst)*l.IntervalUs)))
		tx.Set(ctx, key, fmt.Sprintf("%d %d", sent, sent), 0)
	} else if was == "" {
		// A new limit starts afresh, even where one removed a moment ago
		// left its clocks (they go only with its last held envelope):
		// kept, a 1/h limit's would hold a new 100/s one for hours (found
		// by review). What the old one still listed is re-paced below.
		tx.Del(ctx, key)
	}
	if _, err := tx.Exec(ctx); err != nil {
		return fmt.Errorf("store: set limit: %w", err)
	}
	if was == v {
		return nil
	}
	var err error
	if err == nil {
		var to func(int64) int64
		if to, err = s.slottedMoves(ctx, l.Pattern); err == nil {
			_, _, err = s.releaseLedger(ctx, s.flowKeys("slots", l.Pattern), "", to, true, map[string]bool{})
		}
	}
	if err != nil {
		return fmt.Errorf("store: set limit: re-pacing what the old one held: %w", err)
	}
	return nil
}

// slottedMoves is where a release puts the envelopes of a limit's ledger:
// due in the last ms before now, one ms apart in ledger order, so that
// they are claimed again in the order of their slots (their due order),
// not all at one score in id order.
func (s *Store) slottedMoves(ctx context.Context, pattern string) (to func(int64) int64, err error) {
	pipe := s.rdb.Pipeline()
	now := pipe.Time(ctx)
	n := pipe.ZCard(ctx, s.flowKeys("slots", pattern))
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("store: ledger: %w", err)
	}
	next := now.Val().UnixMilli() - n.Val()
	return func(int64) int64 {
		next++
		return next - 1
	}, nil
}

// RemoveLimit removes the limit on pattern, and makes the envelopes it
// holds due now. It reports whether there was one, and how many it
// released. One between its slot and its hold is released by the
// daemons' next reading of the rules (ReleaseLeftover).
func (s *Store) RemoveLimit(ctx context.Context, pattern string) (bool, int, error) {
	n, err := s.rdb.HDel(ctx, flowKey(s.ns), fieldLimit+pattern).Result()
	if err != nil {
		return false, 0, fmt.Errorf("store: remove limit: %w", err)
	}
	released, err := s.release(ctx, fieldSlotted, pattern)
	return n > 0, released, err
}

// Pause holds every delivery to the targets matching pattern, fleet-wide,
// until Resume. It returns when the pause began (Redis ms; an earlier
// pause of the pattern stands).
func (s *Store) Pause(ctx context.Context, pattern string) (int64, error) {
	now, err := s.redisNowMs(ctx)
	if err != nil {
		return 0, err
	}
	key := flowKey(s.ns)
	pipe := s.rdb.TxPipeline()
	pipe.HSetNX(ctx, key, fieldPause+pattern, now)
	since := pipe.HGet(ctx, key, fieldPause+pattern)
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("store: pause: %w", err)
	}
	return since.Int64()
}

// Resume ends the pause of pattern and moves the envelopes it parked back
// to their due times (all past: they go out now, in due order). It also
// releases what a pause of pattern left parked when its resume was cut
// short. It reports whether pattern was paused, and how many envelopes it
// released.
func (s *Store) Resume(ctx context.Context, pattern string) (bool, int, error) {
	// The pause goes first: released envelopes claimed meanwhile must
	// not be parked again.
	n, err := s.rdb.HDel(ctx, flowKey(s.ns), fieldPause+pattern).Result()
	if err != nil {
		return false, 0, fmt.Errorf("store: resume: %w", err)
	}
	released, err := s.release(ctx, fieldParked, pattern)
	return n > 0, released, err
}

// ReleaseLeftover releases what the list of a rule that is gone still
// holds (kind "parked" for a pause, "slotted" for a limit): envelopes
// listed by a daemon that had not seen the rule go, or in flight when it
// went. A rule set again meanwhile keeps its list. It returns how many it
// released.
func (s *Store) ReleaseLeftover(ctx context.Context, kind, pattern string) (int, error) {
	return s.release(ctx, kind+":", pattern)
}

// release empties the list of marker (fieldParked or fieldSlotted) for
// pattern, unless its rule is in force: each listed envelope still held
// where its hold put it goes back to due, at its due time (parked) or now
// (slotted); one in flight stays listed, with the marker, for the next
// call (the daemons' next reading of the rules makes it); the others
// leave the list. The marker goes only with an empty list, in one step: a
// daemon that lists meanwhile (it had not seen the change yet) sets it
// again in the same step as its listing.
func (s *Store) release(ctx context.Context, marker, pattern string) (int, error) {
	rule, kind := fieldPause, "parked"
	if marker == fieldSlotted {
		rule, kind = fieldLimit, "slots"
	}
	ledger, total, seen := s.flowKeys(kind, pattern), 0, map[string]bool{}
	for {
		in, err := s.rdb.HExists(ctx, flowKey(s.ns), rule+pattern).Result()
		if err != nil || in {
			return total, err
		}
		to := func(score int64) int64 { return score - ParkedBase }
		if marker == fieldSlotted {
			if to, err = s.slottedMoves(ctx, pattern); err != nil {
				return total, err
			}
		}
		moved, empty, err := s.releaseLedger(ctx, ledger, rule+pattern, to, marker == fieldSlotted, seen)
		total += moved
		if err != nil || !empty {
			return total, err
		}
		gone := false
		err = s.rdb.Watch(ctx, func(tx *redis.Tx) error {
			c, err := tx.ZCard(ctx, ledger).Result()
			if err != nil || c > 0 {
				return err
			}
			gone = true
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				if marker == fieldSlotted {
					// The limit's clocks go with its last held envelope:
					// set again, it starts afresh.
					p.Del(ctx, s.flowKeys("tat", pattern))
				}
				return p.HDel(ctx, flowKey(s.ns), marker+pattern).Err()
			})
			return err
		}, ledger)
		switch {
		case errors.Is(err, redis.TxFailedErr), err == nil && !gone:
			continue // listed meanwhile: release that too
		case err != nil:
			return total, err
		}
		return total, nil
	}
}

// releaseLedger puts the envelopes of a ledger (id → the due score it was
// held at; a limit's may carry .5, reserve.lua) back in due at
// to(score), page by page, and takes them off
// it, unless the rule (its field in flowKey; "" for none) is set again meanwhile: what
// a new pause lists then is its own. One in flight stays listed: the
// daemon that holds it may have listed it before its hold is written. It
// returns how many it moved, and whether the ledger is empty.
//
// A limit's ledger (unlistFirst) is emptied of the page before the page
// is released: left there a moment after its envelope is due again, a
// daemon claiming it would find its old slot and hold it there, then out
// of the ledger (a review held envelopes hours late that way through a
// re-pace, and off could not find them). One found in flight is listed
// again, unless its Reserve listed it anew meanwhile.
//
// It counts an envelope once in seen: a daemon that had not seen a resume
// may park one again, and the same release moves it twice (a resume of
// 39 said 51 in CI).
func (s *Store) releaseLedger(ctx context.Context, ledger, rule string, to func(int64) int64, unlistFirst bool, seen map[string]bool) (int, bool, error) {
	total, offset := 0, int64(0)
	for {
		if rule != "" { // "": a re-pace, under the rule in force
			again, err := s.rdb.HExists(ctx, flowKey(s.ns), rule).Result()
			if err != nil || again {
				return total, false, err
			}
		}
		zs, err := s.rdb.ZRangeWithScores(ctx, ledger, offset, offset+999).Result()
		if err != nil || len(zs) == 0 {
			return total, offset == 0 && err == nil, err
		}
		byShard := map[int][]release{}
		scores := make(map[string]float64, len(zs))
		for _, z := range zs {
			member, _ := z.Member.(string)
			scores[member] = z.Score
			id, _, _ := strings.Cut(member, listingSep)
			at := int64(z.Score)
			sh := s.Shard(id)
			byShard[sh] = append(byShard[sh], release{id: id, member: member, from: at, to: to(at)})
		}
		calls := make([]releaseArgs, 0, len(byShard))
		for sh, moves := range byShard {
			calls = append(calls, releaseArgs{due: s.keys[sh].due, inflight: s.keys[sh].inflight, moves: moves})
		}
		if unlistFirst {
			members := make([]any, len(zs))
			for i, z := range zs {
				members[i] = z.Member
			}
			if err := s.rdb.ZRem(ctx, ledger, members...).Err(); err != nil {
				return total, false, err
			}
		}
		res, err := exec(ctx, s, releaseOp, calls)
		if err != nil {
			return total, false, err
		}
		if betweenReleaseAndUnlist != nil {
			betweenReleaseAndUnlist()
		}
		var done, again []any
		var relist []redis.Z
		for i, r := range res {
			for j, code := range r.reply {
				m := calls[i].moves[j]
				switch code {
				case releaseMoved:
					if !seen[m.id] {
						seen[m.id] = true
						total++
					}
					done = append(done, m.member)
				case releaseLeft:
					done = append(done, m.member)
				default:
					again = append(again, m.member)
					relist = append(relist, redis.Z{Score: scores[m.member], Member: m.member})
				}
			}
		}
		if unlistFirst && len(relist) > 0 {
			if err := s.rdb.ZAddNX(ctx, ledger, relist...).Err(); err != nil {
				return total, false, err
			}
		} else if !unlistFirst && len(done) > 0 {
			if err := s.rdb.ZRem(ctx, ledger, done...).Err(); err != nil {
				return total, false, err
			}
		}
		// What stays listed is passed over.
		offset += int64(len(again))
	}
}

// Reserve gives the envelopes ids (due at dueMs), all of targets under
// the limit on l.Pattern, their slots (Redis ms): each once, those already
// held at the slot they were given (a slot long past, or before the
// envelope's due time, was another version's or a paused one's: a new
// slot is taken). A slot at or before the returned Redis time means:
// deliver now. The rate and burst are read from the rule in Redis, so a
// change reaches every daemon's next slot; with the rule gone, every one
// goes now.
func (s *Store) Reserve(ctx context.Context, l Limit, ids []string, dueMs []int64) (nowMs int64, slots []int64, err error) {
	r := exec1(ctx, s, reserveOp, reserveArgs{tat: s.flowKeys("tat", l.Pattern), ledger: s.flowKeys("slots", l.Pattern),
		counts: s.flowKeys("rate", l.Pattern), rules: flowKey(s.ns), pattern: l.Pattern, ids: ids, dueMs: dueMs})
	if !r.ran {
		return 0, nil, fmt.Errorf("store: reserve: %w", r.err)
	}
	return r.reply.nowMs, r.reply.slots, nil
}

// Park lists envelopes a pause of pattern holds, at the due scores their
// Hold settles give them (ParkedBase + due time), so that Resume finds
// them. It runs before those settles: a crash in between leaves a listed
// envelope that was not parked, which Resume leaves as it is.
//
// limits[i], if not "", is the limit ids[i]'s target obeys: a slot it was
// given is forgotten, for it goes out after the resume, under the limit
// as it is then (a slot long past would let it go at once, over the
// rate).
func (s *Store) Park(ctx context.Context, pattern string, ids []string, dueMs []int64, limits []string) error {
	if len(ids) == 0 {
		return nil
	}
	zs := make([]redis.Z, len(ids))
	slotted := map[string][]any{}
	for i, id := range ids {
		// A listing of its own: a release that moved the same id back
		// (listed by an earlier park) and takes that listing off must not
		// take this one with it.
		zs[i] = redis.Z{Score: float64(ParkedBase + dueMs[i]), Member: id + listingSep + strconv.FormatUint(rand.Uint64(), 36)}
		if limits[i] != "" {
			slotted[limits[i]] = append(slotted[limits[i]], id)
		}
	}
	pipe := s.rdb.TxPipeline()
	pipe.ZAdd(ctx, s.flowKeys("parked", pattern), zs...)
	pipe.HSet(ctx, flowKey(s.ns), fieldParked+pattern, "1")
	for l, ids := range slotted {
		pipe.ZRem(ctx, s.flowKeys("slots", l), ids...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("store: park: %w", err)
	}
	return nil
}

// betweenReleaseAndUnlist, when a test sets it, runs after a page of a
// list was released and before its listings are taken off: where a daemon
// that had not seen the change can list again.
var betweenReleaseAndUnlist func()

// listingSep ends the id in a pause's list member "<id>\x00<nonce>": each
// park lists anew (ids hold no NUL: envelope.ParseID).
const listingSep = "\x00"

// FlowHeld is what one rule holds back now.
type FlowHeld struct {
	// Limited counts the envelopes waiting for a slot of the limit on
	// the pattern, Parked those parked by its pause (an upper bound: one
	// cancelled meanwhile is counted until released).
	Limited, Parked int64
	// BacklogMs is how long the limit's slots given so far run on:
	// when the last held envelope goes out.
	BacklogMs int64
	// Rate is how many deliveries the limit let go in the last whole
	// second, fleet-wide.
	Rate int64
}

// Held reads what the rules on patterns hold back, in one round trip.
func (s *Store) Held(ctx context.Context, patterns []string) (map[string]FlowHeld, error) {
	if len(patterns) == 0 {
		return nil, nil
	}
	pipe := s.rdb.Pipeline()
	now := pipe.Time(ctx)
	type cmds struct {
		limited, parked *redis.IntCmd
		tat, rule       *redis.StringCmd
		rate            *redis.SliceCmd
	}
	cs := make([]cmds, len(patterns))
	for i, p := range patterns {
		cs[i] = cmds{tat: pipe.Get(ctx, s.flowKeys("tat", p)), parked: pipe.ZCard(ctx, s.flowKeys("parked", p)),
			rate: pipe.HMGet(ctx, s.flowKeys("rate", p), "s", "n", "p"), rule: pipe.HGet(ctx, flowKey(s.ns), fieldLimit+p)}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("store: held: %w", err)
	}
	// The ledger's entries whose slot is still to come: one cancelled
	// while held stays in the ledger until its slot is a day past, but
	// is not counted once its slot has passed (a review found such a
	// count firing DelaydFlowNotDraining on an idle pattern).
	nowMs := now.Val().UnixMilli()
	pipe = s.rdb.Pipeline()
	states := make([]limitState, len(patterns))
	for i, p := range patterns {
		states[i] = parseLimitState(cs[i].tat.Val())
		cs[i].limited = pipe.ZCount(ctx, s.flowKeys("slots", p), "("+strconv.FormatInt(nowMs, 10), "+inf")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("store: held: %w", err)
	}
	out := make(map[string]FlowHeld, len(patterns))
	for i, p := range patterns {
		h := FlowHeld{Limited: cs[i].limited.Val(), Parked: cs[i].parked.Val()}
		if st := states[i]; st.tatUs > 0 {
			// To the last slot given: the later clock (reserve.lua; a
			// late one's moment comes from sent, less its slack) less
			// one interval and the burst's tolerance.
			l, _ := parseLimit(cs[i].rule.Val())
			last := max(st.tatUs, st.sentUs-reserveSlackUs) - int64(l.Burst)*l.IntervalUs
			h.BacklogMs = max(last/1000-nowMs, 0)
		}
		// The last whole second: n while it is the current one's
		// predecessor, p once the current second has begun.
		if c := cs[i].rate.Val(); len(c) == 3 {
			sec, n, prev := asInt(c[0]), asInt(c[1]), asInt(c[2])
			switch now.Val().Unix() {
			case sec + 1:
				h.Rate = n
			case sec:
				h.Rate = prev
			}
		}
		out[p] = h
	}
	return out, nil
}

// reserveSlackUs is reserve.lua's slack: how late after the one before a
// delivery may go without counting as bunched.
const reserveSlackUs = 10_000

// limitState is a limit's clocks (reserve.lua): the slots given up to
// tatUs, the deliveries let go up to sentUs.
type limitState struct {
	tatUs, sentUs int64
}

func parseLimitState(v string) limitState {
	var st limitState
	if f := strings.Fields(v); len(f) == 2 {
		st.tatUs, _ = strconv.ParseInt(f[0], 10, 64)
		st.sentUs, _ = strconv.ParseInt(f[1], 10, 64)
	}
	return st
}

// redisNowMs is Redis' clock, in ms.
func (s *Store) redisNowMs(ctx context.Context) (int64, error) {
	t, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("store: redis time: %w", err)
	}
	return t.UnixMilli(), nil
}

// strayPage bounds the parked ids a sweep reads from one shard, or from
// one list, at once.
const strayPage = 1000

// ReleaseStrays finds parked envelopes (due at ParkedBase or later) of
// every shard that keep (given the stored envelope) says no pause holds
// any more, and puts them back at their due times: a safety net for what
// no list names (a failover of the rules' Redis master that lost a
// listing its hold outlived; the rules hash deleted by hand). It pages
// through every parked id, and reads the stored envelope only of those no
// pause's list names, so a long pause costs id reads, not payloads. It
// costs one pipeline of one range read a shard while nothing is parked.
// It returns how many it released.
func (s *Store) ReleaseStrays(ctx context.Context, keep func(data []byte) bool) (int, error) {
	listed, err := s.listedParked(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	offsets := make([]int64, s.shards)
	shards := make([]int, s.shards)
	for sh := range shards {
		shards[sh] = sh
	}
	for len(shards) > 0 {
		pipe := s.rdb.Pipeline()
		pages := make([]*redis.ZSliceCmd, len(shards))
		for i, sh := range shards {
			// Parked scores are the highest of the set: pages by rank
			// from the top cost O(log N) each (an offset into a score
			// range costs the offset: a review measured 294 ms of Redis
			// time a sweep of 300k parked), and stop at the first score
			// below ParkedBase.
			pages[i] = pipe.ZRevRangeWithScores(ctx, s.keys[sh].due, offsets[sh], offsets[sh]+strayPage-1)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return n, fmt.Errorf("store: strays: %w", err)
		}
		var calls []releaseArgs
		var callShard, more []int
		for i, sh := range shards {
			zs := pages[i].Val()
			parked := slices.IndexFunc(zs, func(z redis.Z) bool { return z.Score < float64(ParkedBase) })
			if parked < 0 {
				parked = len(zs)
				if len(zs) == strayPage {
					more = append(more, sh)
				}
			}
			zs = zs[:parked]
			offsets[sh] += int64(len(zs))
			var ids []string
			var from []int64
			for _, z := range zs {
				if id, _ := z.Member.(string); !listed[id] {
					ids, from = append(ids, id), append(from, int64(z.Score))
				}
			}
			if len(ids) == 0 {
				continue
			}
			vals, err := s.rdb.HMGet(ctx, s.keys[sh].data, ids...).Result()
			if err != nil {
				return n, fmt.Errorf("store: strays: %w", err)
			}
			var moves []release
			for i, v := range vals {
				str, _ := v.(string)
				if _, _, data := splitValue(str); str == "" || keep(data) {
					continue
				}
				moves = append(moves, release{id: ids[i], from: from[i], to: from[i] - ParkedBase})
			}
			if len(moves) > 0 {
				calls = append(calls, releaseArgs{due: s.keys[sh].due, inflight: s.keys[sh].inflight, moves: moves})
				callShard = append(callShard, sh)
			}
		}
		res, err := exec(ctx, s, releaseOp, calls)
		if err != nil {
			return n, fmt.Errorf("store: strays: %w", err)
		}
		for i, r := range res {
			for _, code := range r.reply {
				if code == releaseMoved {
					n++
					offsets[callShard[i]]-- // it left the parked range
				}
			}
		}
		shards = more
	}
	return n, nil
}

// listedParked is every id a pause's list names (of a pause in force, or
// one whose resume left its list): those are not strays.
func (s *Store) listedParked(ctx context.Context) (map[string]bool, error) {
	rules, err := s.FlowRules(ctx)
	if err != nil {
		return nil, err
	}
	patterns := slices.Clone(rules.Parked)
	for p := range rules.Paused {
		patterns = append(patterns, p)
	}
	slices.Sort(patterns)
	listed := map[string]bool{}
	for _, p := range slices.Compact(patterns) {
		for off := int64(0); ; off += strayPage {
			members, err := s.rdb.ZRange(ctx, s.flowKeys("parked", p), off, off+strayPage-1).Result()
			if err != nil {
				return nil, fmt.Errorf("store: strays: %w", err)
			}
			for _, m := range members {
				id, _, _ := strings.Cut(m, listingSep)
				listed[id] = true
			}
			if len(members) < strayPage {
				break
			}
		}
	}
	return listed, nil
}
