package store

// The fence script (lua/fence.lua), which exec adds to the pipelines of
// operations that wait (ops.go, wait.go).

import _ "embed"

//go:embed lua/fence.lua
var fenceLua string

// fenceScript is the fence of a pipeline whose scripts may have written
// nothing (lua/fence.lua): KEYS[1] a shard's fence key, no ARGV, reply 1.
// It is sent whole (EVAL), so its file holds no comment. allow-oom:
// cancels run over maxmemory, and their fence must too.
var fenceScript = newRawScript("fence", "allow-oom", fenceLua)
