package store

// The intake floor script (lua/intake_floor.lua): its arguments and reply.

import (
	_ "embed"
	"strconv"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/intake_floor.lua
var intakeFloorLua string

// intakeFloorScript may run over maxmemory: it writes one small field,
// and a floor left behind makes a consumer created again repeat more.
var intakeFloorScript = newRawScript("intake_floor", "allow-oom", intakeFloorLua)

// intakeFloorArgs are one call of intake_floor.lua.
type intakeFloorArgs struct {
	key       string // intakeKey
	stream    string
	createdNs int64
	floor     uint64
}

func (intakeFloorArgs) script() *script { return intakeFloorScript }

func (a intakeFloorArgs) encode() call {
	return call{keys: []string{a.key}, argv: []any{a.stream, strconv.FormatInt(a.createdNs, 10), strconv.FormatUint(a.floor, 10)}}
}

// intakeFloorReply is intake_floor.lua's answer: saved, or kept as it was.
type intakeFloorReply struct {
	saved bool
}

func (intakeFloorArgs) decode(cmd *redis.Cmd) (intakeFloorReply, error) {
	v, err := cmd.Int()
	return intakeFloorReply{saved: v == 1}, err
}
