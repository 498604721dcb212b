package store

// The schedule script (lua/schedule.lua): its arguments and reply.

import (
	_ "embed"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/schedule.lua
var scheduleLua string

// scheduleScript upserts a batch of envelopes (lua/schedule.lua). Not
// allowed over maxmemory: it is what fills Redis.
var scheduleScript = newScript("schedule", "", scheduleLua)

// scheduleArgs are one call of schedule.lua: the shards its items touch,
// and its ARGV.
type scheduleArgs struct {
	shards []*shardKeys
	// mark is the one-shot mark of the format to write (value.go);
	// seenForMs how long a stream message is remembered; resendsMs how
	// long a tombstone answers a resend (0: never).
	mark      byte
	seenForMs int64
	resendsMs int64
	items     []scheduleItem
	// fence is the fence key of the shard of the first item that may
	// write nothing (a stream message, a fingerprint), "" for none
	// (wait.go).
	fence string
}

// scheduleItem is one envelope of a schedule call: 3 to 6 values of ARGV.
type scheduleItem struct {
	// k is the envelope's shard, as its index in the call's shards;
	// ARGV gives the shard's key tag once before its run of envelopes.
	k  int
	id string
	// mode "d" (delay: us from now, value the bare envelope), "e" (delay,
	// the first occurrence of a series) or "v" (us since the epoch, value
	// stamped already).
	mode  string
	us    int64
	value []byte
	// streamMsg ("" for a request) and fingerprint ("" for none): a call
	// carrying either may write nothing for it (lua/schedule.lua).
	streamMsg   string
	fingerprint string
}

// scheduleLead is the number of ARGV before the items.
const scheduleLead = 3

func (scheduleArgs) script() *script { return scheduleScript }

// argvOrder is the order of the items in ARGV: shard after shard, each
// shard's in the order given, so the script takes a shard's
// envelopes as one run.
func (a scheduleArgs) argvOrder() []int {
	order := make([]int, len(a.items))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(x, y int) int { return a.items[x].k - a.items[y].k })
	return order
}

func (a scheduleArgs) encode() call {
	argv := make([]any, 0, scheduleLead+6*len(a.items)+4*len(a.shards))
	argv = append(argv, int(a.mark), a.seenForMs, a.resendsMs)
	order := a.argvOrder()
	for x := 0; x < len(order); {
		k, n := a.items[order[x]].k, 0
		for x+n < len(order) && a.items[order[x+n]].k == k {
			n++
		}
		// The shard's mode, unless its envelopes differ, and its
		// columns: the fingerprint and stream message only where an
		// envelope of the shard carries one.
		mode, cols := a.items[order[x]].mode, 3
		for _, i := range order[x : x+n] {
			it := a.items[i]
			if it.mode != mode {
				mode = ""
			}
			if it.streamMsg != "" {
				cols = 5
			} else if it.fingerprint != "" {
				cols = max(cols, 4)
			}
		}
		w := cols
		if mode == "" {
			w++
		}
		argv = append(argv, a.shards[k].tag, n, mode, w)
		for _, i := range order[x : x+n] {
			it := a.items[i]
			argv = append(argv, it.id, it.us, it.value)
			if cols > 3 {
				argv = append(argv, it.fingerprint)
			}
			if cols > 4 {
				argv = append(argv, it.streamMsg)
			}
			if mode == "" {
				argv = append(argv, it.mode)
			}
		}
		x += n
	}
	var touches []string
	if len(a.shards) > 1 {
		for _, sh := range a.shards {
			touches = append(touches, sh.list()...)
		}
	}
	return call{keys: a.shards[0].list(), argv: argv, fence: a.fence, touches: touches}
}

// scheduleReply is schedule.lua's answer: per item, in order, its due
// time in ms; 0 for a stream message stored already, minus the due time
// it had for a resend of a delivered request: both wrote nothing.
type scheduleReply struct {
	due []int64
}

func (a scheduleArgs) decode(cmd *redis.Cmd) (scheduleReply, error) {
	got, err := cmd.Int64Slice()
	if err == nil && len(got) != len(a.items) {
		err = fmt.Errorf("bad reply %v", got)
	}
	if err != nil {
		return scheduleReply{}, err
	}
	// The script answers in ARGV order.
	due := make([]int64, len(got))
	for x, i := range a.argvOrder() {
		due[i] = got[x]
	}
	return scheduleReply{due: due}, nil
}
