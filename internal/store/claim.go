package store

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Claimed is one envelope handed out for delivery.
type Claimed struct {
	ID      string
	DueMs   int64 // the original due time, stable across redeliveries
	Attempt int
	// Base is how many attempts were made before the envelope's last
	// replay: Attempt - Base is the try within its current budget.
	Base int
	// Occurrence is which occurrence of a series this is (from 1), 0 for
	// a one-shot.
	Occurrence int64
	Data       []byte
	// Token names the claim (its lease score: keys.go):
	// only a settle with it changes the envelope.
	Token string
}

// ClaimResult is what one shard's claim returns, in Redis time.
type ClaimResult struct {
	Shard       int
	NowMicros   int64
	NextDueMs   int64 // -1 when nothing else is pending
	NextLeaseMs int64 // earliest lease expiry, -1 when nothing is in flight
	// Missing counts due ids whose data was gone (deleted outside delayd);
	// they are dropped, and reported so nothing vanishes silently.
	Missing int
	// Expired counts the items re-claimed because their lease expired (a
	// daemon died or stalled while delivering them): the first Expired of
	// Items.
	Expired int
	// Oversize: this shard could hand out its first envelope beyond its
	// share of ClaimOptions.Bytes.
	Oversize bool
	// Unknown counts values of a format newer than this daemon reads,
	// given back untouched; UnknownFormat is the newest of them.
	Unknown       int
	UnknownFormat int
	Items         []Claimed
	// Unconfirmed: with redis.wait_replicas, the claim's wait fell short
	// (Why says how). Its items are handed out all the same: a failover
	// before the replicas have it can bring back the previous attempt
	// number, so a redelivery may repeat an attempt.
	Unconfirmed bool
	Why         error
}

// NowMs is the claim's Redis time in whole milliseconds.
func (r ClaimResult) NowMs() int64 { return r.NowMicros / 1000 }

// ClaimOptions bound one claim.
type ClaimOptions struct {
	Batch int
	Lease time.Duration
	// Bytes bounds the stored bytes the whole claim hands out (0: no
	// bound), split evenly over its shards; each shard hands out what fits
	// in its share, and a few shards, in turn from claim to claim, their
	// first envelope even if that alone is larger: as many as Bytes holds
	// of the largest value the last claim handed out (one when unknown, at
	// most maxOversize). So large envelopes still go out several per claim,
	// no envelope is too large to ever go out, and a claim holds about
	// Bytes plus one payload, at most Bytes plus maxOversize payloads (and
	// a quarter share each). Within a share, values over a sixteenth of it
	// take at most three quarters, the rest is kept for smaller ones, and
	// a value that does not fit is skipped, not waited behind (take in
	// lua/claim.lua).
	Bytes int64
}

// Claim atomically takes up to Batch envelopes from each of shards, with a
// lease, in one pipeline: one round trip however many shards are due.
// Envelopes whose lease expired come first, then due ones. Concurrent
// claims from many daemons never hand out one envelope twice.
// If some shards' Redis nodes fail (a Cluster master down), it returns the
// results of the others along with the error.
func (s *Store) Claim(ctx context.Context, shards []int, o ClaimOptions) ([]ClaimResult, error) {
	// Each shard once: two plans of one shard in one call would hand its
	// envelopes out twice (lua/claim.lua reads every shard first).
	if len(shards) > 1 {
		seen := make(map[int]bool, len(shards))
		shards = slices.DeleteFunc(slices.Clone(shards), func(sh int) bool {
			if seen[sh] {
				return true
			}
			seen[sh] = true
			return false
		})
	}
	hint, known := s.hint(), int(markOf(s.newest))+1
	var share int64
	first, over := 0, 0 // shards first.. (wrapping) may hand out one envelope beyond their share
	if o.Bytes > 0 && len(shards) > 0 {
		share = max(o.Bytes/int64(len(shards)), 1)
		first = int(s.claimTurn.Add(1) % uint64(len(shards)))
		// As many as the budget holds of the largest value the last claim
		// handed out (one when unknown), at most maxOversize: envelopes
		// larger than a shard's share still go out several per claim.
		over = 1
		if m := s.claimMax.Load(); m > 0 {
			over = int(min(max(o.Bytes/m, 1), maxOversize))
		}
		over = min(over, len(shards))
	}
	oversize := func(i int) bool { return over > 0 && (i-first+len(shards))%len(shards) < over }
	// Local time against Redis' in largeUntil: a skew only moves when a
	// marked shard goes back to reading four values at a time.
	nowMs := time.Now().UnixMilli()
	call := func(group []int) claimArgs {
		c := claimArgs{batch: o.Batch, leaseMs: o.Lease.Milliseconds(), hint: hint, knownMark: known,
			shards: make([]claimShard, len(group))}
		for j, i := range group {
			sh := shards[i]
			c.shards[j] = claimShard{keys: &s.keys[sh], share: share, oversize: oversize(i), sizeAll: s.largeUntil[sh].Load() >= nowMs}
		}
		return c
	}
	// One call per Redis node: every shard of a single Redis in one.
	groups, res, perr := execByNode(ctx, s, OpClaim, s.byNode(ctx, shards), call)
	if perr != nil {
		perr = fmt.Errorf("store: claim: %w", perr)
	}
	out := make([]ClaimResult, 0, len(shards))
	var largest int64
	for g, c := range res {
		if !c.ran {
			continue // this call's node failed, or its reply: perr says so
		}
		for j, i := range groups[g] {
			// Its writes are confirmed, or why not: the items are handed
			// out all the same (ops.go, the claim's policy).
			reply, why := c.reply[j], c.err
			if reply.large {
				s.markLarge(shards[i], reply.nowMicros/1000)
			}
			r := ClaimResult{
				Shard: shards[i], Oversize: oversize(i), NowMicros: reply.nowMicros, NextDueMs: reply.nextDueMs,
				NextLeaseMs: reply.nextLeaseMs, Missing: reply.missing, Expired: reply.expired, Unknown: reply.unknown,
				Items: make([]Claimed, 0, len(reply.items)), Unconfirmed: why != nil, Why: why,
			}
			if m := reply.unknownMark; m > 0 {
				r.UnknownFormat = formatOf(string([]byte{byte(m)}))
			}
			for _, it := range reply.items {
				due, occurrence, data := splitValue(it.value)
				largest = max(largest, int64(len(it.value)))
				attempt, base := parseAttempt(it.attempt)
				r.Items = append(r.Items, Claimed{ID: it.id, DueMs: due, Attempt: attempt, Base: base, Occurrence: occurrence,
					Data: data, Token: reply.token})
			}
			out = append(out, r)
		}
	}
	if largest > 0 {
		s.claimMax.Store(largest)
	}
	return out, perr
}

// maxOversize bounds the shards of one claim that may hand out an envelope
// beyond their share of its byte budget: a claim holds at most the budget
// plus this many payloads, even right after payloads grew.
const maxOversize = 16

// parseAttempt reads a claim's attempt: a number, or "attempt/base" for an
// envelope replayed after base attempts.
func parseAttempt(v any) (attempt, base int) {
	if str, ok := v.(string); ok {
		a, b, _ := strings.Cut(str, "/")
		attempt, _ = strconv.Atoi(a)
		base, _ = strconv.Atoi(b)
		return attempt, base
	}
	return int(asInt(v)), 0
}
