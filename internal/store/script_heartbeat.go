package store

// The heartbeat script (lua/heartbeat.lua), which Heartbeat and
// AgreeFormats share: its arguments and reply.

import (
	_ "embed"
	"errors"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/heartbeat.lua
var heartbeatLua string

// heartbeatScript keeps a ZSET of members with their expiry: the live
// daemons, or their announced formats (lua/heartbeat.lua).
var heartbeatScript = newRawScript("heartbeat", "allow-oom", heartbeatLua)

// heartbeatArgs are one call of heartbeat.lua.
type heartbeatArgs struct {
	set    string // the members ZSET, or the formats ZSET
	member string
	ttlMs  int64 // 0 removes member
}

func (heartbeatArgs) script() *script { return heartbeatScript }

func (a heartbeatArgs) encode() call {
	return call{keys: []string{a.set}, argv: []any{a.member, a.ttlMs}}
}

// heartbeatReply is heartbeat.lua's answer: Redis time and the live
// members, sorted.
type heartbeatReply struct {
	nowMs   int64
	members []string
}

func (heartbeatArgs) decode(cmd *redis.Cmd) (heartbeatReply, error) {
	raw, err := cmd.Slice()
	if err != nil {
		return heartbeatReply{}, err
	}
	if len(raw) < 1 {
		return heartbeatReply{}, errors.New("malformed reply")
	}
	r := heartbeatReply{nowMs: asInt(raw[0]), members: make([]string, 0, len(raw)-1)}
	for _, m := range raw[1:] {
		if v, ok := m.(string); ok {
			r.members = append(r.members, v)
		}
	}
	return r, nil
}
