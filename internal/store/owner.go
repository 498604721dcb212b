package store

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Shard ownership: with many daemons on one Redis, each shard is scanned by
// one owner at a time. Ownership is a lease: the key {<ns>:<shard>}:owner
// holds the owner's id with a TTL, renewed while the owner lives. Members
// announce themselves with a heartbeat in the {<ns>:members} ZSET (id →
// expiry ms), so every daemon sees the same live set and computes the same
// fair assignment.

// heartbeatScript records member ARGV[1] as alive for ARGV[2] ms, drops
// expired members, and returns {now ms, live member ids...}.
// KEYS[1] members ZSET. Allowed over maxmemory, like ownScript: without
// owners nothing is delivered, and delivering is what frees memory.
var heartbeatScript = newRawScript("allow-oom", `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[2] == '0' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local out = {now}
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do out[#out+1] = m end
return out
`)

// ownScript holds or releases one shard. KEYS[1] owner key; ARGV[1] the
// daemon id, ARGV[2] TTL ms, ARGV[3] "h" hold (take if free, renew if
// ours) or "r" release (delete if ours). Returns 1 if the daemon owns the
// shard afterwards, else 0.
var ownScript = newRawScript("allow-oom", `
local cur = redis.call('GET', KEYS[1])
if ARGV[3] == 'r' then
  if cur == ARGV[1] then redis.call('DEL', KEYS[1]) end
  return 0
end
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
  return 1
end
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
  return 1
end
return 0
`)

// Heartbeat marks id alive for ttl and returns the live members (sorted)
// and Redis' time. A ttl of 0 removes id: a graceful leave.
func (s *Store) Heartbeat(ctx context.Context, id string, ttl time.Duration) ([]string, int64, error) {
	raw, err := s.run(ctx, heartbeatScript, []string{membersKey(s.ns)}, id, ttl.Milliseconds()).Slice()
	if err != nil {
		s.failed(err)
		return nil, 0, fmt.Errorf("store: heartbeat: %w", err)
	}
	members := make([]string, 0, len(raw)-1)
	for _, m := range raw[1:] {
		if v, ok := m.(string); ok {
			members = append(members, v)
		}
	}
	return members, asInt(raw[0]), nil
}

// Own holds the shards in hold and releases those in release, for id, in
// one pipeline. It returns which of hold id owns afterwards.
func (s *Store) Own(ctx context.Context, id string, ttl time.Duration, hold, release []int) ([]bool, error) {
	n := len(hold) + len(release)
	if n == 0 {
		return nil, nil
	}
	cmds, err := s.pipelined(ctx, ownScript, n, func(i int) ([]string, []any) {
		if i < len(hold) {
			return []string{s.keys[hold[i]].owner}, []any{id, ttl.Milliseconds(), "h"}
		}
		return []string{s.keys[release[i-len(hold)]].owner}, []any{id, ttl.Milliseconds(), "r"}
	})
	if err != nil {
		return nil, fmt.Errorf("store: own: %w", err)
	}
	owned := make([]bool, len(hold))
	for i := range hold {
		v, _ := cmds[i].Int()
		owned[i] = v == 1
	}
	return owned, nil
}

// Owners returns the current owner id of every shard ("" when none).
func (s *Store) Owners(ctx context.Context) ([]string, error) {
	keys := make([]string, s.shards)
	for i := range keys {
		keys[i] = s.keys[i].owner
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, s.shards)
	for i, k := range keys {
		cmds[i] = pipe.Get(ctx, k)
	}
	_, _ = pipe.Exec(ctx)
	out := make([]string, s.shards)
	for i, c := range cmds {
		if err := c.Err(); err != nil && err != redis.Nil {
			return nil, fmt.Errorf("store: owners: %w", err)
		}
		out[i] = c.Val()
	}
	return out, nil
}
