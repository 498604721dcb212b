package store

import (
	"context"
	_ "embed"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The Lua scripts live in lua/, one file each, headed by a comment on their
// KEYS, ARGV and reply, and naming their keys on their first lines; the Go
// file that runs a script declares it. The shard scripts share a prelude
// (lua/prelude.lua): key type checks, chunked commands, the value header,
// the attempts values, and one fenced block for the formats of older
// versions.

//go:embed lua/prelude.lua
var prelude string

// allScripts are the scripts Ping loads and Ready expects cached.
var allScripts = []*script{scheduleScript, cancelScript, claimScript, ackScript, replayScript, checkScript,
	heartbeatScript, ownScript}

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

// pipelined runs n calls of one script in a pipeline with EVALSHA. If Redis
// lost its script cache (restart, failover, SCRIPT FLUSH) it loads the script
// and resends only the calls that failed with NOSCRIPT: those did not run,
// while the others did and must not run twice. On error the commands are
// returned too, each with its own result: under Cluster one node can fail
// while the others answer.
func (s *Store) pipelined(ctx context.Context, sc *script, n int, call func(i int) ([]string, []any)) ([]*redis.Cmd, error) {
	return s.pipelinedOnce(ctx, sc, n, call, nil, true)
}

// pipelinedOnce is pipelined, reloading the script once if reload is set;
// the pipeline ends with the fences of the shards in fences (wait.go).
func (s *Store) pipelinedOnce(ctx context.Context, sc *script, n int, call func(i int) ([]string, []any), fences []int,
	reload bool) ([]*redis.Cmd, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.Cmd, n)
	rs := s.pick(sc)
	for i := range n {
		keys, args := call(i)
		cmds[i] = rs.EvalSha(ctx, pipe, keys, args...)
	}
	fenced := make([]*redis.Cmd, len(fences))
	for i, sh := range fences {
		fenced[i] = s.fence(ctx, pipe, sh)
	}
	_, err := pipe.Exec(ctx)
	for _, f := range fenced {
		if f.Err() != nil {
			waitFrom(ctx).fenced(f.Err())
		}
	}
	if err == nil {
		return cmds, nil
	}
	var redo []int
	for i, c := range cmds {
		if reload && c.Err() != nil && redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			redo = append(redo, i)
		}
	}
	if len(redo) > 0 && s.load(ctx, sc) == nil {
		again, _ := s.pipelinedOnce(ctx, sc, len(redo), func(j int) ([]string, []any) { return call(redo[j]) }, fences, false)
		for j, i := range redo {
			cmds[i] = again[j]
		}
	}
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			s.failed(err)
			return cmds, err
		}
	}
	return cmds, nil
}

// run is one call of sc.
func (s *Store) run(ctx context.Context, sc *script, keys []string, args ...any) *redis.Cmd {
	cmds, _ := s.pipelined(ctx, sc, 1, func(int) ([]string, []any) { return keys, args })
	return cmds[0]
}
