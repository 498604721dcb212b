-- heartbeat records member ARGV[1] as alive for ARGV[2] ms (0: removes
-- it), drops expired members, and returns {now ms, live member ids...}
-- (Heartbeat and AgreeFormats, owner.go). KEYS[1] is the members ZSET, or
-- the formats ZSET, whose members are "<format>:<id>". Without the shard
-- prelude. Allowed over maxmemory, like own: without owners nothing is
-- delivered, and delivering is what frees memory.
local members = KEYS[1]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[2] == '0' then
  redis.call('ZREM', members, ARGV[1])
else
  redis.call('ZADD', members, now + tonumber(ARGV[2]), ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', members, '-inf', now)
local out = {now}
for _, m in ipairs(redis.call('ZRANGE', members, 0, -1)) do out[#out+1] = m end
return out
