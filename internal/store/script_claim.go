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
// (lua/claim.lua). Allowed over maxmemory: delivering is what frees memory.
var claimScript = newScript("claim", "allow-oom", claimLua)

// claimArgs are one call of claim.lua, on one shard.
type claimArgs struct {
	shard   *shardKeys
	batch   int
	leaseMs int64
	// hint is the k of the claim's token (1..991); knownMark the series
	// mark of the newest format this daemon reads.
	hint      int
	knownMark int
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
	over := "0"
	if a.oversize {
		over = "1"
	}
	all := "0"
	if a.sizeAll {
		all = "1"
	}
	return call{keys: a.shard.list(), argv: []any{a.batch, a.leaseMs, a.hint, a.knownMark, a.share, over, all}}
}

// claimReply is claim.lua's answer.
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

// claimHead is the number of reply values before the items.
const claimHead = 9

func (claimArgs) decode(cmd *redis.Cmd) (claimReply, error) {
	raw, err := cmd.Slice()
	if err != nil {
		return claimReply{}, err
	}
	if len(raw) < claimHead || (len(raw)-claimHead)%3 != 0 {
		return claimReply{}, fmt.Errorf("malformed reply of %d values", len(raw))
	}
	r := claimReply{nowMicros: asInt(raw[0]), nextDueMs: asInt(raw[1]), nextLeaseMs: asInt(raw[2]),
		missing: int(asInt(raw[3])), expired: int(asInt(raw[4])), unknown: int(asInt(raw[6])), unknownMark: asInt(raw[7]),
		items: make([]claimItem, 0, (len(raw)-claimHead)/3)}
	r.token, _ = raw[5].(string)
	r.large = asInt(raw[8]) == 1
	for j := claimHead; j < len(raw); j += 3 {
		id, _ := raw[j].(string)
		v, _ := raw[j+2].(string)
		r.items = append(r.items, claimItem{id: id, attempt: raw[j+1], value: v})
	}
	return r, nil
}
