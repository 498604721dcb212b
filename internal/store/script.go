package store

import (
	"context"
	_ "embed"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The Lua scripts live in lua/, one file each, headed by a comment on their
// KEYS, ARGV and reply, and naming their keys on their first lines. Beside
// each, script_<name>.go declares it and holds its ARGV and its reply as
// named structs, encoded and decoded there and nowhere else: a change of a
// script's arguments or reply changes that file and its callers' fields. The shard scripts share a prelude
// (lua/prelude.lua): key type checks, chunked commands, the value header,
// and the attempts values.

//go:embed lua/prelude.lua
var prelude string

// allScripts are the scripts Ping loads and Ready expects cached.
var allScripts = []*script{scheduleScript, cancelScript, claimScript, ackScript, replayScript, checkScript,
	heartbeatScript, ownScript, reserveScript, releaseScript}

// script is one Lua script in two builds. Redis 7 reads script flags from
// a shebang line: "allow-oom" lets the scripts that free memory or must run
// for delayd to make progress (claim, ack, cancel, ownership) run while
// Redis is over maxmemory, and a script without it is refused whole, before
// it writes anything, instead of failing at its first write. Servers that
// do not know flags (Redis 6, the embedded emulation) get the plain build,
// where a script is refused at its first write (and all our scripts check
// before they write).
type script struct {
	// name is its file's, lua/<name>.lua.
	name           string
	flagged, plain *redis.Script
	// shard: its KEYS are shard keys in list's order (a shard script),
	// and it is a function of the library too (library.go), of body and
	// flags.
	shard       bool
	body, flags string
}

// newScript builds a shard script: the prelude, then body. flags may be
// empty (the script then only gets Redis 7's refuse-whole-when-OOM).
func newScript(name, flags, body string) *script {
	sc := newRawScript(name, flags, prelude+body)
	sc.shard, sc.body, sc.flags = true, body, flags
	return sc
}

// newRawScript builds a script without the shard prelude.
func newRawScript(name, flags, src string) *script {
	shebang := "#!lua"
	if flags != "" {
		shebang += " flags=" + flags
	}
	return &script{name: name, flagged: redis.NewScript(shebang + "\n" + src), plain: redis.NewScript(src)}
}

// pick returns the build the server understands.
func (s *Store) pick(sc *script) *redis.Script {
	if s.noFlags.Load() {
		return sc.plain
	}
	return sc.flagged
}

// load loads sc: the library, where sc is one of its functions and the
// server has functions, else sc into the server's script cache. If the
// server refuses the flagged build as a script it cannot compile, it has
// no script flags: the store switches to the plain builds for good.
func (s *Store) load(ctx context.Context, sc *script) error {
	if s.fn(sc) != "" {
		// Without functions (found out now), the script instead.
		if err := s.loadLibrary(ctx); err != nil || s.fn(sc) != "" {
			return err
		}
	}
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

// call is one script call, encoded (script_<name>.go): its KEYS and ARGV,
// and for a call that may write nothing, the fence key of its shard
// (wait.go; exec sends the fence when its operation's policy asks).
type call struct {
	keys  []string
	argv  []any
	fence string
	// touches are the keys the call may touch, where they are more than
	// keys (schedule, claim and ack name the keys of their other shards
	// from ARGV): nameWrongType looks for a wrong type among them.
	touches []string
}

// send runs calls of one script in a pipeline, with FCALL (a function of
// the library) or EVALSHA, followed by a fence for each key in fences,
// whose errors it records in fenceErrs. If
// Redis lost its functions or script cache (restart, failover, FUNCTION
// or SCRIPT FLUSH) it loads the library or script and resends only the
// calls that failed with "Function not found" or NOSCRIPT (with the
// fences again): those did not run, while the others did and must not
// run twice. Each command keeps its own result: under Cluster one node
// can fail while the others answer. Only exec calls it.
func (s *Store) send(ctx context.Context, sc *script, calls []call, fences []string, fenceErrs map[string]error,
	reload bool) []*redis.Cmd {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	rs, fn := s.pick(sc), s.fn(sc)
	for i, c := range calls {
		if fn != "" {
			cmds[i] = pipe.FCall(ctx, fn, c.keys, c.argv...)
		} else {
			cmds[i] = rs.EvalSha(ctx, pipe, c.keys, c.argv...)
		}
	}
	fenced := make([]*redis.Cmd, len(fences))
	for i, key := range fences {
		fenced[i] = s.pick(fenceScript).Eval(ctx, pipe, []string{key})
	}
	_, err := pipe.Exec(ctx)
	for i, f := range fenced {
		if f.Err() != nil {
			fenceErrs[fences[i]] = f.Err()
		}
	}
	if err == nil {
		return cmds
	}
	var redo []call
	var at []int
	for i, c := range cmds {
		if fn != "" && unknownFCall(c.Err()) {
			// A server without functions that the store has loaded
			// nothing on yet (delayd doctor sends without Ping): scripts
			// from now on, reload loads this one.
			s.noFunctions.Store(true)
		}
		if reload && c.Err() != nil && (redis.HasErrorPrefix(c.Err(), "NOSCRIPT") || missingFunction(c.Err()) || unknownFCall(c.Err())) {
			redo = append(redo, calls[i])
			at = append(at, i)
		}
	}
	if len(redo) > 0 {
		if err := s.load(ctx, sc); err != nil {
			// Say why the script is still missing (a deadline that ran
			// out while reloading it, most often), not only NOSCRIPT.
			for _, i := range at {
				cmds[i].SetErr(fmt.Errorf("%w (reloading %s.lua failed: %v)", cmds[i].Err(), sc.name, err))
			}
		} else {
			again := s.send(ctx, sc, redo, fences, fenceErrs, false)
			for j, i := range at {
				cmds[i] = again[j]
			}
		}
	}
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			s.failed(err)
			break
		}
	}
	return cmds
}

// keyKinds are the types of a shard's keys in KEYS order (keys.go, list),
// as lua/prelude.lua's kinds.
var keyKinds = [...]string{"zset", "zset", "hash", "hash", "zset", "hash", "hash", "zset", "zset"}

// wrongTypeError is a shard script's failure on a key of the wrong type,
// before any write: an error reply of Redis, so classify counts it not
// written.
type wrongTypeError string

func (e wrongTypeError) Error() string { return string(e) }
func (wrongTypeError) RedisError()     {}

// nameWrongType names the key behind a shard script's WRONGTYPE: a script
// fails at its first read of a key of the wrong type, before any write
// (lua/prelude.lua), with Redis' WRONGTYPE, which does not say which key.
// This looks up the types of the call's keys and returns the error that
// says so; err itself when it is another error, when no key of KEYS has a
// wrong type (a bucket's key), or when the lookup fails.
func (s *Store) nameWrongType(ctx context.Context, keys []string, err error) error {
	if msg := err.Error(); !strings.Contains(msg, "WRONGTYPE") || strings.Contains(msg, "WRONGTYPE delayd key ") {
		return err
	}
	pipe := s.rdb.Pipeline()
	types := make([]*redis.StatusCmd, len(keys))
	for i, k := range keys {
		types[i] = pipe.Type(ctx, k)
	}
	if _, perr := pipe.Exec(ctx); perr != nil {
		return err
	}
	for i, c := range types {
		if t, want := c.Val(), keyKinds[i%len(keyKinds)]; t != "none" && t != want {
			return wrongTypeError(fmt.Sprintf("WRONGTYPE delayd key %s is a %s, not a %s", keys[i], t, want))
		}
	}
	return err
}
