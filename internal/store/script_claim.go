package store

// The claim script (lua/claim.lua): its arguments and reply.

import (
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/claim.lua
var claimLua string

// claimScript hands out due envelopes and expired leases with a new lease
// (lua/claim.lua), of one or more shards a call. Allowed over maxmemory:
// delivering is what frees memory. Under Redis Cluster it reaches the
// shards of its node beyond the first (allow-cross-slot-keys).
var claimScript = newScript("claim", "allow-oom,allow-cross-slot-keys", claimLua)

// claimArgs are one call of claim.lua, on one or more shards.
type claimArgs struct {
	shards  []claimShard
	batch   int
	leaseMs int64
	// hint is the k of the claim's token (1..991); knownMark the series
	// mark of the newest format this daemon reads.
	hint      int
	knownMark int
}

// claimShard is one shard of a claim call.
type claimShard struct {
	keys *shardKeys
	// share bounds the bytes handed out (0: no bound); oversize lets the
	// first envelope out even if it alone is larger.
	share    int64
	oversize bool
	// sizeAll: the shard is known to hold large values (Store.largeUntil):
	// every value is sized before it is read.
	sizeAll bool
}

func (claimArgs) script() *script { return claimScript }

func (a claimArgs) encode() call {
	argv := make([]any, 0, 4+4*len(a.shards))
	argv = append(argv, a.batch, a.leaseMs, a.hint, a.knownMark)
	var touches []string
	for _, sh := range a.shards {
		if len(a.shards) > 1 {
			touches = append(touches, sh.keys.list()...)
		}
		over, all := "0", "0"
		if sh.oversize {
			over = "1"
		}
		if sh.sizeAll {
			all = "1"
		}
		argv = append(argv, sh.keys.tag, sh.share, over, all)
	}
	return call{keys: a.shards[0].keys.list(), argv: argv, touches: touches}
}

// claimReply is claim.lua's answer for one shard.
type claimReply struct {
	nowMicros   int64
	nextDueMs   int64 // -1: nothing else is due
	nextLeaseMs int64 // -1: nothing is in flight
	missing     int   // due ids without data, dropped
	expired     int   // expired leases re-claimed
	token       string
	// unknown counts values of a newer format given back; unknownMark is
	// the newest of their marks (0 for none).
	unknown     int
	unknownMark int64
	// large: the claim saw a value over 4 kB (Store.largeUntil).
	large bool
	items []claimItem
}

// claimItem is one envelope handed out: 3 values of the reply.
type claimItem struct {
	id      string
	attempt any // n, or "n/b" (parseAttempt)
	value   string
}

// claimHead is the number of reply values of a shard before its items.
const claimHead = 9

// decode reads the reply of every shard of the call, in order.
func (a claimArgs) decode(cmd *redis.Cmd) ([]claimReply, error) {
	raw, err := cmd.Slice()
	if err != nil {
		return nil, err
	}
	if len(raw) < 1 {
		return nil, fmt.Errorf("malformed reply of %d values", len(raw))
	}
	now := asInt(raw[0])
	out := make([]claimReply, 0, len(a.shards))
	for j := 1; j < len(raw); {
		if j+claimHead > len(raw) {
			return nil, fmt.Errorf("malformed reply of %d values", len(raw))
		}
		h := raw[j : j+claimHead]
		n := int(asInt(h[8]))
		if n < 0 || j+claimHead+3*n > len(raw) {
			return nil, fmt.Errorf("malformed reply of %d values", len(raw))
		}
		r := claimReply{nowMicros: now, nextDueMs: asInt(h[0]), nextLeaseMs: asInt(h[1]), missing: int(asInt(h[2])),
			expired: int(asInt(h[3])), unknown: int(asInt(h[5])), unknownMark: asInt(h[6]), large: asInt(h[7]) == 1,
			items: make([]claimItem, 0, n)}
		r.token, _ = h[4].(string)
		for k := j + claimHead; k < j+claimHead+3*n; k += 3 {
			id, _ := raw[k].(string)
			v, _ := raw[k+2].(string)
			r.items = append(r.items, claimItem{id: id, attempt: raw[k+1], value: v})
		}
		out = append(out, r)
		j += claimHead + 3*n
	}
	if len(out) != len(a.shards) {
		return nil, fmt.Errorf("reply for %d shards, want %d", len(out), len(a.shards))
	}
	return out, nil
}
