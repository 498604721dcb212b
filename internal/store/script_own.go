package store

// The own script (lua/own.lua): its arguments and reply.

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/own.lua
var ownLua string

// ownScript holds or releases one shard's lease (lua/own.lua).
var ownScript = newRawScript("own", "allow-oom", ownLua)

// ownArgs are one call of own.lua: hold (take if free, renew if ours) or
// release one shard's owner key.
type ownArgs struct {
	owner   string // the shard's owner key
	id      string
	ttlMs   int64
	release bool
}

func (ownArgs) script() *script { return ownScript }

func (a ownArgs) encode() call {
	op := "h"
	if a.release {
		op = "r"
	}
	return call{keys: []string{a.owner}, argv: []any{a.id, a.ttlMs, op}}
}

// ownReply is own.lua's answer: whether id owns the shard afterwards.
type ownReply struct {
	owned bool
}

func (ownArgs) decode(cmd *redis.Cmd) (ownReply, error) {
	v, err := cmd.Int()
	return ownReply{owned: v == 1}, err
}
