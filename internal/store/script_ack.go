package store

// The ack script (lua/ack.lua): its arguments and reply.

import (
	_ "embed"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/ack.lua
var ackLua string

// ackScript settles claimed envelopes (lua/ack.lua), of one or more
// shards a call. Allowed over maxmemory: settling is what frees memory.
// Under Redis Cluster it reaches the shards of its node beyond the first
// (allow-cross-slot-keys).
var ackScript = newScript("ack", "allow-oom,allow-cross-slot-keys", ackLua)

// ackArgs are one call of ack.lua, on one or more shards.
type ackArgs struct {
	shards []ackShard
	// retryMs is the retry delay of releases without their own;
	// resendsMs how long a tombstone answers resends (0: none are kept).
	retryMs   int64
	resendsMs int64
}

// ackShard is one shard's settles of an ack call.
type ackShard struct {
	keys    *shardKeys
	settles []ackSettle
}

// ackSettle is one settle of an ack call: 5 values of ARGV.
type ackSettle struct {
	id, token string
	// op: "a", "r", "u", "d", "n" or "t" (lua/ack.lua; ackOp builds it).
	op string
	// errOrFP is the error to record, or for "t" the request's
	// fingerprint.
	errOrFP string
	// at is the settle's own retry delay in ms ("" for retryMs), for "n"
	// the next occurrence's due ms, for "t" the tombstone's time.
	at string
}

// ackOp encodes st as one settle of ack.lua; tombstones says whether
// resends are remembered.
func ackOp(st Settle, tombstones bool) ackSettle {
	op := string(st.Outcome)
	switch st.Outcome {
	case 0:
		op = string(Delivered)
	}
	errOrFP, at := st.Error, ""
	switch {
	case st.Outcome == Next:
		at = strconv.FormatInt(st.NextDueMs, 10)
	case st.Outcome == Hold:
		errOrFP, at = "", strconv.FormatInt(st.HoldUntilMs, 10)
	case op == string(Delivered) && st.Request != "" && tombstones:
		op, errOrFP, at = "t", st.Request, strconv.FormatInt(st.SinceMs, 10)
	case st.RetryDelay > 0:
		at = strconv.FormatInt(st.RetryDelay.Milliseconds(), 10)
	}
	return ackSettle{id: st.ID, token: st.Token, op: op, errOrFP: errOrFP, at: at}
}

func (ackArgs) script() *script { return ackScript }

func (a ackArgs) encode() call {
	n := 2
	for _, sh := range a.shards {
		n += 2 + 5*len(sh.settles)
	}
	argv := make([]any, 0, n)
	argv = append(argv, a.retryMs, a.resendsMs)
	var touches []string
	for _, sh := range a.shards {
		if len(a.shards) > 1 {
			touches = append(touches, sh.keys.list()...)
		}
		argv = append(argv, sh.keys.tag, len(sh.settles))
		for _, st := range sh.settles {
			argv = append(argv, st.id, st.token, st.op, st.errOrFP, st.at)
		}
	}
	return call{keys: a.shards[0].keys.list(), argv: argv, touches: touches}
}

// ackReply is ack.lua's answer.
type ackReply struct {
	nowMs int64
	// settled counts the settles whose token was the claim; buried those
	// of them moved to the dead set.
	settled, buried int
}

func (ackArgs) decode(cmd *redis.Cmd) (ackReply, error) {
	v, err := cmd.Int64Slice()
	if err == nil && len(v) != 3 {
		err = fmt.Errorf("bad reply %v", v)
	}
	if err != nil {
		return ackReply{}, err
	}
	return ackReply{nowMs: v[0], settled: int(v[1]), buried: int(v[2])}, nil
}
