package store

// The fraction script (lua/fraction.lua): its arguments and reply.

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/fraction.lua
var fractionLua string

// fractionScript rewrites whole lease scores as fractions (lua/fraction.lua).
// Allowed over maxmemory: it adds nothing.
var fractionScript = newScript("fraction", "allow-oom", fractionLua)

// fractionArgs are one call of fraction.lua, on one shard.
type fractionArgs struct {
	shard *shardKeys
	max   int // scores rewritten at most
}

func (fractionArgs) script() *script { return fractionScript }

func (a fractionArgs) encode() call { return call{keys: a.shard.list(), argv: []any{a.max}} }

// fractionReply is fraction.lua's answer: how many scores it rewrote.
type fractionReply struct{ rewritten int }

func (fractionArgs) decode(cmd *redis.Cmd) (fractionReply, error) {
	n, err := cmd.Int()
	return fractionReply{rewritten: n}, err
}
