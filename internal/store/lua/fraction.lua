-- fraction rewrites up to ARGV[1] whole lease scores (format 3) of one
-- shard as fractions naming the same token, t / 1000 (format 2's form),
-- for a fleet that writes format 2 again: a daemon of a version before
-- format 3 joined (a rollback), and it re-leases only fractional scores
-- (AgreeFormats, owner.go). A settle of this version finds its claim in
-- either form (ack.lua). Returns how many it rewrote.
-- Allowed over maxmemory: it adds nothing.
local inflight = KEYS[2]

-- inflight is read before it is written (prelude): no type check.
local z = redis.call('ZRANGEBYSCORE', inflight, string.format('%d', leaseSplit), '+inf', 'WITHSCORES',
  'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
for i = 1, #z, 2 do
  local t = tonumber(z[i+1])
  out[#out+1] = string.format('%d.%03d', (t - t % 1000) / 1000, t % 1000)
  out[#out+1] = z[i]
end
if #out > 0 then chunks('ZADD', inflight, out) end
return #out / 2
