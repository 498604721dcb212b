package store

// The shard scripts as one Redis Functions library (Redis 7.0+): loaded
// once, so a call runs only its own script. Sent as scripts (EVALSHA),
// each carries the prelude, which Redis runs again at every call before
// the script starts: some 28,000 instructions a call.

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// library is the Lua source of a Functions library of the shard scripts,
// and the function name of each. Its name carries a hash of its source,
// and so does each function's name (function names are global across a
// server's libraries): daemons of two versions on one Redis each load and
// call their own library, side by side.
type library struct {
	name    string
	src     string
	scripts []*script
	fns     map[*script]string
}

// libPlaceholder stands for the library's name in its source until the
// name, a hash of that source, is known.
const libPlaceholder = "@LIBRARY@"

// newLibrary builds the library of scripts; extra is Lua appended to its
// source, which tests use to stand in for another version's library.
//
// The prelude runs once, when the library loads, at its top level (it
// only defines functions and tables: a library may not call Redis while
// it loads), and each script is the body of a function, whose upvalues
// are the prelude's locals. The prelude reads KEYS and ARGV, globals
// of a script, which a function gets as arguments instead: they are
// locals of the library, set by each function when it starts.
func newLibrary(scripts []*script, extra string) *library {
	var b strings.Builder
	b.WriteString("local KEYS, ARGV\n")
	b.WriteString(prelude)
	for _, sc := range scripts {
		flags := ""
		if sc.flags != "" {
			flags = "'" + strings.ReplaceAll(sc.flags, ",", "', '") + "'"
		}
		b.WriteString("\nredis.register_function{function_name = '" + libPlaceholder + "_" + sc.name +
			"', flags = {" + flags + "}, callback = function(keys, args)\nKEYS, ARGV = keys, args\n")
		b.WriteString(sc.body)
		b.WriteString("\nend}\n")
	}
	b.WriteString(extra)
	sum := sha1.Sum([]byte(b.String()))
	name := "delayd_" + hex.EncodeToString(sum[:])[:12]
	l := &library{name: name, src: "#!lua name=" + name + "\n" + strings.ReplaceAll(b.String(), libPlaceholder, name),
		scripts: scripts, fns: map[*script]string{}}
	for _, sc := range scripts {
		l.fns[sc] = name + "_" + sc.name
	}
	return l
}

// shardLibrary is the library of every shard script of allScripts.
var shardLibrary = sync.OnceValue(func() *library {
	var shard []*script
	for _, sc := range allScripts {
		if sc.shard {
			shard = append(shard, sc)
		}
	}
	return newLibrary(shard, "")
})

// fn is the function that runs sc, "" when sc is sent as a script: it is
// not in the library, or the server has no functions.
func (s *Store) fn(sc *script) string {
	if s.lib == nil || s.noFunctions.Load() {
		return ""
	}
	return s.lib.fns[sc]
}

// loadLibrary loads the library on the server, on every master under
// Cluster. A library of that name loaded already is the same code (its
// name is its hash): another daemon of this version loaded it first. A
// server that does not know FUNCTION (before Redis 7.0, the embedded
// emulation), or a user its ACL does not allow it, switches the store to
// scripts for good, and loadLibrary returns nil: the caller then loads
// the script it needs.
func (s *Store) loadLibrary(ctx context.Context) error {
	load := func(ctx context.Context, c redis.Cmdable) error {
		err := c.FunctionLoad(ctx, s.lib.src).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil
		}
		return err
	}
	err := s.everyMaster(ctx, load)
	if err != nil && noFunctions(err) {
		s.noFunctions.Store(true)
		return nil
	}
	return err
}

// noFunctions: err is a server's refusal of FUNCTION as a command it does
// not know, or one this user may not run.
func noFunctions(err error) bool {
	var re redis.Error
	if !asRedisError(err, &re) {
		return false
	}
	return strings.Contains(strings.ToLower(err.Error()), "unknown command") || redis.HasErrorPrefix(err, "NOPERM")
}

// libraryLoaded reports whether the library is on the server (on every
// master under Cluster).
func (s *Store) libraryLoaded(ctx context.Context) (bool, error) {
	missing := false
	var mu sync.Mutex
	list := func(ctx context.Context, c redis.Cmdable) error {
		libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: s.lib.name}).Result()
		if err != nil {
			return err
		}
		if len(libs) == 0 {
			mu.Lock()
			missing = true
			mu.Unlock()
		}
		return nil
	}
	err := s.everyMaster(ctx, list)
	return !missing, err
}

// everyMaster runs f on the server, on every master at once under Cluster.
func (s *Store) everyMaster(ctx context.Context, f func(context.Context, redis.Cmdable) error) error {
	if c, ok := s.rdb.(*redis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return f(ctx, n) })
	}
	return f(ctx, s.rdb)
}

// unknownFCall: the call did not run because the server does not know
// FCALL.
func unknownFCall(err error) bool {
	var re redis.Error
	if !asRedisError(err, &re) {
		return false
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "unknown command `fcall`") || strings.Contains(msg, "unknown command 'fcall'")
}

// missingFunction: the call did not run because its function is not on
// the server (FUNCTION FLUSH, a restart without persistence, a new node).
func missingFunction(err error) bool {
	return redis.HasErrorPrefix(err, "Function not found")
}
