package store

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"
)

// script is one Lua script in two builds. Redis 7 reads script flags from
// a shebang line: "allow-oom" lets the scripts that free memory or must run
// for delayd to make progress (claim, ack, cancel, ownership) run while
// Redis is over maxmemory, and a script without it is refused whole, before
// it writes anything, instead of failing at its first write. Servers that
// do not know flags (Redis 6, the embedded emulation) get the plain build,
// where a script is refused at its first write (and all our scripts check
// before they write).
type script struct {
	flagged, plain *redis.Script
}

// newScript builds a shard script: the prelude, then body. flags may be
// empty (the script then only gets Redis 7's refuse-whole-when-OOM).
func newScript(flags, body string) *script {
	return newRawScript(flags, prelude+body)
}

// newRawScript builds a script without the shard prelude.
func newRawScript(flags, src string) *script {
	shebang := "#!lua"
	if flags != "" {
		shebang += " flags=" + flags
	}
	return &script{flagged: redis.NewScript(shebang + "\n" + src), plain: redis.NewScript(src)}
}

// pick returns the build the server understands.
func (s *Store) pick(sc *script) *redis.Script {
	if s.noFlags.Load() {
		return sc.plain
	}
	return sc.flagged
}

// load loads sc into the server's script cache. If the server refuses the
// flagged build as a script it cannot compile, it has no script flags: the
// store switches to the plain builds for good.
func (s *Store) load(ctx context.Context, sc *script) error {
	err := s.pick(sc).Load(ctx, s.rdb).Err()
	if err != nil && isCompileError(err) {
		// Another caller may have switched already: either way, plain.
		s.noFlags.Store(true)
		err = sc.plain.Load(ctx, s.rdb).Err()
	}
	return err
}

func isCompileError(err error) bool {
	var re redis.Error
	if !asRedisError(err, &re) {
		return false
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "compil") || strings.Contains(msg, "shebang") || strings.Contains(msg, "syntax")
}
