-- own holds or releases one shard (Own, owner.go). KEYS[1] is the shard's
-- owner key; ARGV[1] the daemon id, ARGV[2] TTL ms, ARGV[3] "h" hold (take
-- if free, renew if ours) or "r" release (delete if ours). Returns 1 if
-- the daemon owns the shard afterwards, else 0. Without the shard prelude.
-- Allowed over maxmemory: without owners nothing is delivered.
local owner = KEYS[1]

local cur = redis.call('GET', owner)
if ARGV[3] == 'r' then
  if cur == ARGV[1] then redis.call('DEL', owner) end
  return 0
end
if cur == ARGV[1] then
  redis.call('PEXPIRE', owner, tonumber(ARGV[2]))
  return 1
end
if not cur then
  redis.call('SET', owner, ARGV[1], 'PX', tonumber(ARGV[2]))
  return 1
end
return 0
