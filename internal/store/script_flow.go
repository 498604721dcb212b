package store

// The flow-control scripts (lua/reserve.lua, lua/release.lua): their
// arguments and replies.

import (
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/reserve.lua
var reserveLua string

//go:embed lua/release.lua
var releaseLua string

// reserveScript gives rate-limit slots (lua/reserve.lua); releaseScript
// puts held envelopes of a shard back in due order (lua/release.lua).
var (
	reserveScript = newRawScript("reserve", "allow-oom", reserveLua)
	releaseScript = newRawScript("release", "allow-oom", releaseLua)
)

// reserveArgs are one call of reserve.lua: one limit, many ids.
type reserveArgs struct {
	tat, ledger, counts, rules string
	pattern                    string
	ids                        []string
	dueMs                      []int64
}

func (reserveArgs) script() *script { return reserveScript }

func (a reserveArgs) encode() call {
	argv := make([]any, 0, 1+2*len(a.ids))
	argv = append(argv, fieldLimit+a.pattern)
	for i, id := range a.ids {
		argv = append(argv, id, a.dueMs[i])
	}
	return call{keys: []string{a.tat, a.ledger, a.counts, a.rules}, argv: argv}
}

// reserveReply is reserve.lua's answer: Redis time, and per id its slot.
type reserveReply struct {
	nowMs int64
	slots []int64
}

func (a reserveArgs) decode(cmd *redis.Cmd) (reserveReply, error) {
	v, err := cmd.Int64Slice()
	if err == nil && len(v) != 1+len(a.ids) {
		err = fmt.Errorf("bad reply %v", v)
	}
	if err != nil {
		return reserveReply{}, err
	}
	return reserveReply{nowMs: v[0], slots: v[1:]}, nil
}

// releaseArgs are one call of release.lua, on one shard's due and
// inflight sets.
type releaseArgs struct {
	due, inflight string
	moves         []release
}

// release is one held envelope to put back: from the due score it was
// held at to the one it gets.
type release struct {
	id       string
	member   string // in its list
	from, to int64
}

func (releaseArgs) script() *script { return releaseScript }

func (a releaseArgs) encode() call {
	argv := make([]any, 0, 3*len(a.moves))
	for _, m := range a.moves {
		argv = append(argv, m.id, m.from, m.to)
	}
	return call{keys: []string{a.due, a.inflight}, argv: argv}
}

// What release.lua answers for one id.
const (
	releaseLeft     = 0 // not where it was held: cancelled, replaced, delivered
	releaseMoved    = 1
	releaseInFlight = 2 // claimed: perhaps on its way to being held
)

func (a releaseArgs) decode(cmd *redis.Cmd) ([]int64, error) {
	v, err := cmd.Int64Slice()
	if err == nil && len(v) != len(a.moves) {
		err = fmt.Errorf("bad reply %v", v)
	}
	return v, err
}
