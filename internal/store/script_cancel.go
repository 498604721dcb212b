package store

// The cancel script (lua/cancel.lua), which Cancel and Purge share: its
// arguments and reply.

import (
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/cancel.lua
var cancelLua string

// cancelScript removes envelopes wherever they are, or only dead ones
// (lua/cancel.lua).
var cancelScript = newScript("cancel", "allow-oom", cancelLua)

// cancelArgs are one call of cancel.lua, on one shard.
type cancelArgs struct {
	shard *shardKeys
	// deadOnly removes only ids found in the dead set (a purge): ARGV
	// then starts with "".
	deadOnly bool
	ids      []string
}

func (cancelArgs) script() *script { return cancelScript }

func (a cancelArgs) encode() call {
	argv := make([]any, 0, 1+len(a.ids))
	if a.deadOnly {
		argv = append(argv, "")
	}
	for _, id := range a.ids {
		argv = append(argv, id)
	}
	// A cancel of an id not stored writes nothing.
	return call{keys: a.shard.list(), argv: argv, fence: a.shard.fence}
}

// What cancel.lua answers for one id.
const (
	cancelNotStored = 0 // nothing written for it
	cancelRemoved   = 1
	// cancelInFlight: removed, while a delivery may already be out (it
	// was claimed, or an earlier attempt was counted).
	cancelInFlight = 2
)

// cancelReply is cancel.lua's answer: per id, in order, a cancel code.
type cancelReply struct {
	codes []int64
}

func (a cancelArgs) decode(cmd *redis.Cmd) (cancelReply, error) {
	codes, err := cmd.Int64Slice()
	if err == nil && len(codes) != len(a.ids) {
		err = fmt.Errorf("bad reply %v", codes)
	}
	return cancelReply{codes: codes}, err
}
