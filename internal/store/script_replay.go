package store

// The replay script (lua/replay.lua): its arguments and reply.

import (
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/replay.lua
var replayLua string

// replayScript moves dead envelopes back to due (lua/replay.lua).
var replayScript = newScript("replay", "allow-oom", replayLua)

// replayArgs are one call of replay.lua, on one shard: the ids to replay.
type replayArgs struct {
	shard *shardKeys
	ids   []string
}

func (replayArgs) script() *script { return replayScript }

func (a replayArgs) encode() call {
	argv := make([]any, len(a.ids))
	for i, id := range a.ids {
		argv[i] = id
	}
	return call{keys: a.shard.list(), argv: argv}
}

// replayReply is replay.lua's answer: Redis time, and how many of the ids
// were dead (and are due now).
type replayReply struct {
	nowMs int64
	dead  int
}

func (replayArgs) decode(cmd *redis.Cmd) (replayReply, error) {
	v, err := cmd.Int64Slice()
	if err == nil && len(v) != 2 {
		err = fmt.Errorf("bad reply %v", v)
	}
	if err != nil {
		return replayReply{}, err
	}
	return replayReply{nowMs: v[0], dead: int(v[1])}, nil
}
