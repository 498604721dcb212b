package store

// The check script (lua/check.lua): its arguments and reply.

import (
	_ "embed"
	"errors"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/check.lua
var checkLua string

// checkScript checks one page of one shard against the invariants of
// keys.go, and repairs what it finds if asked (lua/check.lua).
var checkScript = newScript("check", "allow-oom", checkLua)

// checkArgs are one call of check.lua: one page of one phase.
type checkArgs struct {
	shard  *shardKeys
	phase  string // one of checkPhases
	cursor string // the SCAN cursor, "0" to start
	page   int
	repair bool
}

func (checkArgs) script() *script { return checkScript }

func (a checkArgs) encode() call {
	repair := "0"
	if a.repair {
		repair = "1"
	}
	return call{keys: a.shard.list(), argv: []any{a.phase, a.cursor, a.page, repair}}
}

// checkReply is check.lua's answer: the next cursor ("0" at the end) and
// what the page found, by kind.
type checkReply struct {
	cursor string
	found  map[string]int
}

func (checkArgs) decode(cmd *redis.Cmd) (checkReply, error) {
	raw, err := cmd.Slice()
	if err != nil {
		return checkReply{}, err
	}
	if len(raw) < 1 || len(raw)%2 != 1 {
		return checkReply{}, errors.New("malformed reply")
	}
	r := checkReply{found: map[string]int{}}
	r.cursor, _ = raw[0].(string)
	for i := 1; i < len(raw); i += 2 {
		kind, _ := raw[i].(string)
		r.found[kind] += int(asInt(raw[i+1]))
	}
	return r, nil
}
