// Package store owns everything delayd keeps in Redis: key names, Lua
// scripts and the client. No other package speaks Redis.
package store

import (
	"context"
	_ "embed"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Store is the sharded delay set in one Redis deployment.
type Store struct {
	self   string // WithMember
	rdb    redis.UniversalClient
	ns     string
	shards int
	keys   []shardKeys
	// cluster: every script call must stay within one shard's slot.
	cluster bool
	// lastReload throttles cluster topology reloads (unix nanos).
	lastReload atomic.Int64
	// noFlags: the server does not know Lua script flags (see script).
	noFlags atomic.Bool
	// lib is the library of the shard scripts (library.go); noFunctions:
	// the server has no functions, and the store sends scripts.
	lib         *library
	noFunctions atomic.Bool
	// newest is the newest stored format this daemon reads; write is the
	// format it writes now (AgreeFormats).
	newest int
	write  atomic.Int32
	// gated: the shard scripts wait for CheckSchema (schemaOK; schema.go).
	gated    bool
	schemaOK atomic.Bool
	// hint picks the k of a claim's token (keys.go); tests narrow it.
	hint func() int
	// seenFor is how long a shard remembers a stream message it stored.
	seenFor time.Duration
	// resends is how long after its due time a delivered id's tombstone
	// answers a resend of its request (0: resends are not remembered).
	resends time.Duration
	// claimTurn picks the first shard of a byte-bounded claim that may
	// hand out one envelope beyond its share; claimMax is the largest
	// value the last claim handed out.
	claimTurn atomic.Uint64
	claimMax  atomic.Int64
	// largeUntil is, per shard, until when (ms since the epoch) its claims
	// size every value before reading it: set from the due time of a
	// large value this store scheduled, and from a claim that met one
	// (markLarge). HMGET replies inside a script cost far more than their
	// bytes once large, and a shard that reads its values four and
	// sixteen at a time reads large ones that way before it knows.
	largeUntil []atomic.Int64
	// wait: writes are confirmed by replicas (wait.go); probing holds the
	// wait state of each operation that probes (ops.go).
	wait    WaitOptions
	probing map[string]*probing
}

// Option configures a Store.
type Option func(*Store)

// WithNewestFormat makes the store announce that it reads formats up to f
// (FormatIntegerLeases, or formatNext, which only tests define) and write
// f once every live daemon reads it: it stands in for the next version in
// tests of mixed fleets.
func WithNewestFormat(f int) Option {
	return func(s *Store) { s.newest = min(max(f, FormatIntegerLeases), formatNext) }
}

// WithTokenHint replaces the source of the k of claim tokens (1..991).
// Tests narrow it to provoke equal hints; tokens stay unique regardless.
func WithTokenHint(hint func() int) Option {
	return func(s *Store) { s.hint = hint }
}

// WithStreamMemory sets how long a shard remembers the stream messages it
// stored (default 5m): longer than the stream redelivers a message whose
// ack was lost.
func WithStreamMemory(d time.Duration) Option {
	return func(s *Store) { s.seenFor = d }
}

// WithResendMemory sets how long after its due time a delivered one-shot
// with a fingerprint (Item.Request) keeps a tombstone, so that a resend of
// the same request is answered with that due time instead of scheduled
// again (intake.dedupe_window; 0, the default here, keeps none).
func WithResendMemory(d time.Duration) Option {
	return func(s *Store) { s.resends = d }
}

// New returns a store over rdb with the namespace and fixed shard count.
func New(rdb redis.UniversalClient, ns string, shards int, opts ...Option) *Store {
	_, cluster := rdb.(*redis.ClusterClient)
	s := &Store{rdb: rdb, ns: ns, shards: shards, keys: make([]shardKeys, shards), cluster: cluster,
		newest: newestFormat, hint: func() int { return 1 + rand.IntN(991) }, seenFor: 5 * time.Minute, lib: shardLibrary()}
	for _, o := range opts {
		o(s)
	}
	s.probing = map[string]*probing{}
	for op, p := range policies {
		if p.wait == probes {
			s.probing[op] = &probing{}
		}
	}
	s.installWait()
	// Until the fleet's formats are known, the oldest this version
	// reads: every daemon since it reads it.
	s.write.Store(FormatIntegerLeases)
	for i := range s.keys {
		s.keys[i] = keysFor(ns, i)
	}
	s.largeUntil = make([]atomic.Int64, shards)
	return s
}

// Shards is the number of shards.
func (s *Store) Shards() int { return s.shards }

// Shard is the shard an id lives in.
func (s *Store) Shard(id string) int { return ShardOf(id, s.shards) }

// Close closes the Redis client.
func (s *Store) Close() error { return s.rdb.Close() }

// Ping checks that Redis answers and loads the library and the scripts,
// so the first requests do not pay for reloading round trips.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("store: ping: %w", err)
	}
	if err := s.loadLibrary(ctx); err != nil {
		return fmt.Errorf("store: load the library: %w", err)
	}
	for _, sc := range allScripts {
		if s.fn(sc) != "" {
			continue
		}
		if err := s.load(ctx, sc); err != nil {
			return fmt.Errorf("store: load scripts: %w", err)
		}
	}
	return nil
}

// Item is one envelope to schedule.
type Item struct {
	ID string
	// Exactly one applies: AtMicros is absolute (µs since the epoch) when
	// Absolute is set, else DelayMicros is added to Redis' own time.
	Absolute    bool
	AtMicros    int64
	DelayMicros int64
	// Series: the envelope is a recurring series, and its first
	// occurrence is due at AtMicros or after DelayMicros.
	Series bool
	Data   []byte
	// StreamMsg names the intake stream message the item came from
	// (sequence and publish time), "" for a request: a shard that stored
	// it already does not store it again (Schedule answers StoredBefore).
	StreamMsg string
	// Request is the request's fingerprint (envelope.Request.Fingerprint)
	// for a one-shot with a publisher's id, "" otherwise: an id whose
	// tombstone holds it is a resend of a delivered request
	// (WithResendMemory), answered with its due time; it stores nothing
	// and leaves a newer version of the id stored since as it is.
	Request string
}

// ScheduleKind is what Schedule did with one item.
type ScheduleKind uint8

const (
	// NotWritten: the item's script did not run (its error says why).
	NotWritten ScheduleKind = iota
	// Stored: written now, due at DueMs. With ErrNotReplicated it is on
	// the master and falls due there, unconfirmed by the replicas.
	Stored
	// StoredBefore: a stream message (Item.StreamMsg) a shard stored
	// already; left as it is, DueMs 0.
	StoredBefore
	// Resend: a resend of a delivered request (Item.Request); nothing
	// stored, DueMs is the due time the delivered one had.
	Resend
)

// Scheduled is Schedule's answer for one item, decided here once from
// the script's reply (whose sign carries the kind) so that no caller
// decodes it.
type Scheduled struct {
	Kind  ScheduleKind
	DueMs int64 // ms since the epoch; see the kinds
}

// Schedule upserts items and returns what it did with each (Scheduled),
// and per item the error that kept it from being stored (nil when
// stored). An error wraps ErrNotWritten when the item is certainly not
// stored, else ErrOutcomeUnknown. On a single Redis the whole batch is one
// script call; under Cluster it is one call per shard (a script must stay
// in one slot), all in one pipeline, and a failed node fails only its shards.
func (s *Store) Schedule(ctx context.Context, items []Item) ([]Scheduled, []error) {
	var calls []scheduleArgs
	var idx [][]int          // per call, the items it carries
	byShard := map[int]int{} // shard → call
	slots := map[int]int{}   // shard → its index in its call's shards
	mark := markOf(int(s.write.Load()))
	for i, it := range items {
		sh := s.Shard(it.ID)
		ci, ok := byShard[sh]
		if !ok {
			if s.cluster || len(calls) == 0 {
				c := scheduleArgs{mark: mark, seenForMs: s.seenFor.Milliseconds(), resendsMs: s.resends.Milliseconds()}
				if !s.cluster {
					// Sized for the whole batch when one call takes it all (a
					// single Redis); a Cluster's call per shard grows as needed.
					c.items = make([]scheduleItem, 0, len(items))
				}
				calls, idx = append(calls, c), append(idx, nil)
			}
			ci = len(calls) - 1
			byShard[sh] = ci
		}
		c := &calls[ci]
		off, ok := slots[sh]
		if !ok {
			off = len(c.shards)
			slots[sh] = off
			c.shards = append(c.shards, &s.keys[sh])
		}
		mode, us, v := "d", it.DelayMicros, it.Data
		if it.Series && !it.Absolute {
			mode = "e"
		}
		if it.Absolute {
			occurrence := int64(0)
			if it.Series {
				occurrence = 1
			}
			mode, us, v = "v", it.AtMicros, stampValue(mark, ceilMs(it.AtMicros), occurrence, it.Data)
		}
		idx[ci] = append(idx[ci], i)
		fp := it.Request
		if s.resends <= 0 {
			fp = ""
		}
		c.items = append(c.items, scheduleItem{k: off, id: it.ID, mode: mode, us: us, value: v,
			streamMsg: it.StreamMsg, fingerprint: fp})
		if (it.StreamMsg != "" || fp != "") && c.fence == "" {
			// A stream message stored already, or a resend, is answered
			// without a write.
			c.fence = s.keys[sh].fence
		}
	}
	res, _ := exec(ctx, s, OpSchedule, calls)
	out := make([]Scheduled, len(items))
	errs := make([]error, len(items))
	for ci, r := range res {
		for j, i := range idx[ci] {
			if r.ran {
				// Written but not confirmed: the due time is still
				// returned, the envelope is on the master and falls due
				// there.
				out[i] = scheduledOf(r.reply.due[j])
			}
			if err := r.errFor(out[i].Kind == Stored); err != nil {
				errs[i] = fmt.Errorf("store: schedule: %w", err)
			}
			if out[i].Kind == Stored && len(items[i].Data) > largeValue {
				// Due already (a time in the past) counts from now.
				s.markLarge(s.Shard(items[i].ID), max(out[i].DueMs, time.Now().UnixMilli()))
			}
		}
	}
	return out, errs
}

// scheduledOf reads the schedule script's answer for one item
// (lua/schedule.lua): > 0 stored at that due time, 0 a stream message
// stored before, < 0 a resend, the due time it had negated.
func scheduledOf(due int64) Scheduled {
	switch {
	case due > 0:
		return Scheduled{Kind: Stored, DueMs: due}
	case due == 0:
		return Scheduled{Kind: StoredBefore}
	}
	return Scheduled{Kind: Resend, DueMs: -due}
}

// largeValue is the stored size over which a value is read alone, after
// it was sized (lua/claim.lua, take).
const largeValue = 4096

// largeFor is how long after a large value's due time, or after a claim
// met one, its shard's claims still size every value first: its retries
// and the large values scheduled beside it.
const largeFor = time.Minute

// markLarge has claims on shard size every value first until largeFor
// after dueMs.
func (s *Store) markLarge(shard int, dueMs int64) {
	until := dueMs + largeFor.Milliseconds()
	for l := &s.largeUntil[shard]; ; {
		was := l.Load()
		if was >= until || l.CompareAndSwap(was, until) {
			return
		}
	}
}

// Cancelled is the outcome of a cancel.
type Cancelled struct {
	// Existed: the envelope was stored, and is removed now.
	Existed bool
	// InFlight: a delivery may already be out: it was claimed for
	// delivery when cancelled, or an earlier attempt was made whose
	// publish was not confirmed.
	InFlight bool
}

// Cancel removes the envelope with id, wherever it is. An error wraps
// ErrNotWritten or ErrOutcomeUnknown.
func (s *Store) Cancel(ctx context.Context, id string) (Cancelled, error) {
	r := exec1(ctx, s, OpCancel, cancelArgs{shard: &s.keys[s.Shard(id)], ids: []string{id}})
	var code int64 = cancelNotStored
	if r.ran {
		code = r.reply.codes[0]
	}
	if err := r.errFor(code != cancelNotStored); err != nil {
		return Cancelled{}, fmt.Errorf("store: cancel: %w", err)
	}
	return Cancelled{Existed: code != cancelNotStored, InFlight: code == cancelInFlight}, nil
}

// Purge deletes the given ids if they are in the dead set, and returns how
// many were.
func (s *Store) Purge(ctx context.Context, ids []string) (int, error) {
	byShard := s.byShard(ids)
	calls := make([]cancelArgs, len(byShard))
	for i, sh := range byShard {
		calls[i] = cancelArgs{shard: &s.keys[sh.shard], deadOnly: true, ids: sh.ids}
	}
	res, err := exec(ctx, s, purgeOp, calls)
	if err != nil {
		return 0, fmt.Errorf("store: purge: %w", err)
	}
	n := 0
	for _, r := range res {
		for _, v := range r.reply.codes {
			if v != cancelNotStored {
				n++
			}
		}
	}
	return n, nil
}

// Replay moves the given dead ids back to due at once, their attempt
// numbers going on where they were, with a fresh budget of tries, and
// returns how many were dead. The budget is recorded as "n/b" (keys.go).
func (s *Store) Replay(ctx context.Context, ids []string) (int, error) {
	byShard := s.byShard(ids)
	calls := make([]replayArgs, len(byShard))
	for i, sh := range byShard {
		calls[i] = replayArgs{shard: &s.keys[sh.shard], ids: sh.ids}
	}
	res, err := exec(ctx, s, replayOp, calls)
	if err != nil {
		return 0, fmt.Errorf("store: replay: %w", err)
	}
	n := 0
	for _, r := range res {
		n += r.reply.dead
	}
	return n, nil
}

// shardIDs are the ids of one shard.
type shardIDs struct {
	shard int
	ids   []string
}

// byShard groups ids by shard.
func (s *Store) byShard(ids []string) []shardIDs {
	at := map[int]int{}
	var out []shardIDs
	for _, id := range ids {
		sh := s.Shard(id)
		i, ok := at[sh]
		if !ok {
			i = len(out)
			at[sh] = i
			out = append(out, shardIDs{shard: sh})
		}
		out[i].ids = append(out[i].ids, id)
	}
	return out
}

// Counts are the sizes of one shard's sets.
type Counts struct {
	Pending, Inflight, Dead int64
}

func asInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}
